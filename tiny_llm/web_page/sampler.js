// Step 09's sampler in JavaScript (tiny_llm/generate.py's next_token_probs and the draw):
// temperature, then top-k, then top-p, then one draw from a seeded generator. Temperature 0
// is greedy: the first of the largest logits, as torch's argmax picks.

// mulberry32: a small seeded generator of numbers in [0, 1). Not PyTorch's generator, so a
// seed gives the page its own repeatable stories, not the ones Python writes with that seed.
export function seededRandom(seed) {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export function argmax(logits) {
  let best = 0;
  for (let i = 1; i < logits.length; i++) if (logits[i] > logits[best]) best = i;
  return best;
}

// The same checks as check_sampling in Python, with the same limits.
export function checkSampling({ temperature, topK, topP }) {
  if (!(Number.isFinite(temperature) && temperature >= 0)) {
    throw new Error(`temperature must be a number >= 0 (0 means greedy), got ${temperature}`);
  }
  if (temperature > 0 && temperature < 1e-6) {
    throw new Error(`temperature ${temperature} is too small to divide by: use 0 or at least 1e-6`);
  }
  if (topK !== null && !(Number.isInteger(topK) && topK >= 1)) {
    throw new Error(`top-k must be a whole number >= 1 (or empty for no limit), got ${topK}`);
  }
  if (topP !== null && !(topP >= 1e-6 && topP <= 1)) {
    throw new Error(`top-p must be in (0, 1] (or empty for no limit), got ${topP}`);
  }
}

// logits (Float32Array of V) -> probabilities (Float64Array of V) after temperature (> 0),
// top-k (keep the k largest) and top-p (keep the most likely tokens until their mass reaches
// topP; the first always stays). Filtered tokens get probability 0.
export function nextTokenProbs(logits, { temperature = 1, topK = null, topP = null } = {}) {
  const V = logits.length;
  const scaled = Float64Array.from(logits, (x) => x / temperature);
  // one order for both filters: descending, ties in index order (a stable sort)
  const order = Array.from({ length: V }, (_, i) => i).sort((a, b) => scaled[b] - scaled[a] || a - b);
  const keep = new Uint8Array(V);
  const k = topK === null ? V : Math.min(topK, V);
  for (let r = 0; r < k; r++) keep[order[r]] = 1;
  const probs = softmax(scaled, keep);
  if (topP !== null) {
    let before = 0;  // mass of the tokens ranked above this one
    for (const i of order) {
      if (!keep[i]) continue;
      if (before >= topP) keep[i] = 0;
      before += probs[i];
    }
    return softmax(scaled, keep);
  }
  return probs;
}

function softmax(scaled, keep) {
  let max = -Infinity;
  for (let i = 0; i < scaled.length; i++) if (keep[i] && scaled[i] > max) max = scaled[i];
  const out = new Float64Array(scaled.length);
  let total = 0;
  for (let i = 0; i < scaled.length; i++) {
    if (keep[i]) total += out[i] = Math.exp(scaled[i] - max);
  }
  for (let i = 0; i < out.length; i++) out[i] /= total;
  return out;
}

// One token: greedy at temperature 0, else a draw from nextTokenProbs with `random()`.
export function sampleToken(logits, settings, random) {
  if (settings.temperature === 0) return argmax(logits);
  const probs = nextTokenProbs(logits, settings);
  let u = random();
  let last = 0;
  for (let i = 0; i < probs.length; i++) {
    if (probs[i] === 0) continue;
    last = i;
    u -= probs[i];
    if (u < 0) return i;
  }
  return last;  // rounding left a sliver of u: the last token that could be drawn
}
