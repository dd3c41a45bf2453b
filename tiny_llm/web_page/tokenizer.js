// Step 02's tokenizer in JavaScript: byte-level BPE read from the same tokenizer.json that
// Hugging Face `tokenizers` wrote (tiny_llm/tokenize.py). Encoding takes four moves, as there:
//   1. <|endoftext|> (and any other special token) is cut out whole, before anything else;
//   2. the rest is split into words by GPT-2's rule (a space stays with the word after it);
//   3. each word's UTF-8 bytes become printable characters, one character per byte;
//   4. the merges are applied, the lowest-ranked (earliest learned) pair first, until none fits.
// Decoding joins the tokens' characters, turns them back into bytes and reads those as UTF-8.

// GPT-2's pre-tokenizer rule: contractions, letters, digits, other symbols, each with at most
// one leading space; runs of spaces keep their last space for the word that follows.
const WORDS = /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu;

// Every byte gets a printable character: the printable Latin-1 bytes stand for themselves, the
// other 68 (control characters, space, ...) are moved to 256 and up, in order.
export function byteAlphabet() {
  const bytes = [];
  for (let b = 33; b <= 126; b++) bytes.push(b);
  for (let b = 161; b <= 172; b++) bytes.push(b);
  for (let b = 174; b <= 255; b++) bytes.push(b);
  const chars = bytes.slice();
  let moved = 0;
  for (let b = 0; b < 256; b++) {
    if (!bytes.includes(b)) {
      bytes.push(b);
      chars.push(256 + moved++);
    }
  }
  const toChar = new Array(256);
  const toByte = new Map();
  bytes.forEach((b, i) => {
    toChar[b] = String.fromCharCode(chars[i]);
    toByte.set(String.fromCharCode(chars[i]), b);
  });
  return { toChar, toByte };
}

const escapeRegExp = (s) => s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");

export class Tokenizer {
  // `json`: the parsed tokenizer.json
  constructor(json) {
    if (!json || !json.model || json.model.type !== "BPE") {
      throw new Error("tokenizer.json does not hold a BPE model: write it with tiny_llm.tokenize");
    }
    this.vocab = new Map(Object.entries(json.model.vocab));
    this.tokens = [];
    for (const [token, id] of this.vocab) this.tokens[id] = token;
    this.special = new Map();
    for (const added of json.added_tokens || []) {
      this.tokens[added.id] = added.content;
      if (added.special) this.special.set(added.content, added.id);
    }
    // merges: "a b" strings (older files) or ["a", "b"] pairs; the rank is the position
    this.ranks = new Map();
    json.model.merges.forEach((merge, rank) => {
      const [a, b] = typeof merge === "string" ? merge.split(" ") : merge;
      this.ranks.set(a + " " + b, rank);
    });
    const names = [...this.special.keys()].sort((x, y) => y.length - x.length);
    this.specialRule = names.length ? new RegExp(`(${names.map(escapeRegExp).join("|")})`) : null;
    this.bytes = byteAlphabet();
    this.encoder = new TextEncoder();
    this.cache = new Map();
  }

  // One word (already as byte characters) -> its token ids, by merging pairs in rank order.
  bpe(word) {
    const known = this.cache.get(word);
    if (known) return known;
    let parts = Array.from(word);
    while (parts.length > 1) {
      let best = -1;
      let bestRank = Infinity;
      for (let i = 0; i < parts.length - 1; i++) {
        const rank = this.ranks.get(parts[i] + " " + parts[i + 1]);
        if (rank !== undefined && rank < bestRank) {
          bestRank = rank;
          best = i;
        }
      }
      if (best < 0) break;
      const merged = parts[best] + parts[best + 1];
      const next = [];
      for (let i = 0; i < parts.length; i++) {  // every occurrence of that pair, left to right
        if (i < parts.length - 1 && parts[i] + parts[i + 1] === merged &&
            this.ranks.get(parts[i] + " " + parts[i + 1]) === bestRank) {
          next.push(merged);
          i++;
        } else {
          next.push(parts[i]);
        }
      }
      parts = next;
    }
    const ids = parts.map((p) => {
      const id = this.vocab.get(p);
      if (id === undefined) throw new Error(`no token for ${JSON.stringify(p)} in tokenizer.json`);
      return id;
    });
    this.cache.set(word, ids);
    return ids;
  }

  encode(text) {
    const ids = [];
    const pieces = this.specialRule ? text.split(this.specialRule) : [text];
    for (const piece of pieces) {
      if (this.special.has(piece)) {
        ids.push(this.special.get(piece));
        continue;
      }
      for (const [word] of piece.matchAll(WORDS)) {
        let chars = "";
        for (const b of this.encoder.encode(word)) chars += this.bytes.toChar[b];
        ids.push(...this.bpe(chars));
      }
    }
    return ids;
  }

  // Special tokens are left out, as `tokenizer.decode(ids)` does in Python.
  decode(ids, skipSpecial = true) {
    const bytes = [];
    let text = "";
    const flush = () => {
      text += new TextDecoder().decode(new Uint8Array(bytes));
      bytes.length = 0;
    };
    for (const id of ids) {
      const token = this.tokens[id];
      if (token === undefined) throw new Error(`token id ${id} is not in the vocabulary`);
      if ([...this.special.values()].includes(id)) {
        if (!skipSpecial) {
          flush();
          text += token;
        }
        continue;
      }
      for (const ch of token) bytes.push(this.bytes.toByte.get(ch));
    }
    flush();
    return text;
  }
}
