// The page: load the model with onnxruntime-web (WebAssembly), then write a story one token
// at a time, as step 09's generate does without a cache: the last max_seq_len tokens go into
// the graph, the logits of the last position come out, the sampler picks the next token.
import { Tokenizer } from "./tokenizer.js";
import { checkSampling, sampleToken, seededRandom } from "./sampler.js";

const $ = (id) => document.getElementById(id);
const state = { session: null, tokenizer: null, settings: null, stop: false };
window.tinyLLM = state;  // the browser test reads state.ids and state.done

function say(sentence, kind = "note") {
  $("status").textContent = sentence;
  $("status").className = kind;
}

async function fetchOk(name, how) {
  let response;
  try {
    response = await fetch(name);
  } catch (err) {
    throw new Error(`${name} could not be fetched (${err.message}): serve this folder with ` +
                    "`python -m http.server -d FOLDER` and open the address it prints");
  }
  if (!response.ok) {
    throw new Error(`${name} is missing from this folder (HTTP ${response.status}): write the ` +
                    "folder again with `uv run python -m tiny_llm.web --checkpoint CKPT --out DIR`");
  }
  return how === "json" ? response.json() : response.arrayBuffer();
}

async function load() {
  if (typeof WebAssembly !== "object") {
    say("This browser cannot run WebAssembly, which the model needs: open the page in a " +
        "current Firefox, Chrome, Edge or Safari.", "error");
    return;
  }
  say("Loading the model...");
  const ort = await import("./ort.wasm.min.mjs");
  ort.env.wasm.wasmPaths = new URL("./", document.baseURI).href;  // the runtime is beside us
  // Threads need a cross-origin-isolated page (COOP and COEP headers); else one thread.
  ort.env.wasm.numThreads = self.crossOriginIsolated ? Math.min(4, navigator.hardwareConcurrency || 1) : 1;
  state.settings = await fetchOk("model.json", "json");
  state.tokenizer = new Tokenizer(await fetchOk("tokenizer.json", "json"));
  const model = await fetchOk("model.onnx", "bytes");
  state.session = await ort.InferenceSession.create(model, { executionProviders: ["wasm"] });
  state.ort = ort;
  state.threads = ort.env.wasm.numThreads;
  const s = state.settings;
  $("about").textContent = `${s.checkpoint}, step ${s.step.toLocaleString("en")}, ` +
    `${(model.byteLength / 1e6).toFixed(1)} MB${s.int8 ? " (int8)" : ""}, context ` +
    `${s.max_seq_len} tokens, WebAssembly with ${ort.env.wasm.numThreads} thread(s)`;
  if (s.requests) showRequestForm(s.requests);
  $("write").disabled = false;
  say("Ready: write a prompt, or leave it empty to start a new story.");
  document.body.dataset.state = "ready";
}

function showRequestForm(learned) {
  $("request").hidden = false;
  $("sentence-row").hidden = !learned.fields.includes("sentence");
  $("summary-row").hidden = !learned.fields.includes("summary");
  for (const feature of learned.features) {
    const label = document.createElement("label");
    label.innerHTML = `<input type="checkbox" value="${feature}"> ${feature}`;
    $("features").append(label);
  }
}

// Step 17's render_request: the fields in their fixed order, then "Story:".
function requestPrompt() {
  const lines = [];
  const features = [...$("features").querySelectorAll("input:checked")].map((box) => box.value);
  const words = $("words").value.split(",").map((w) => w.trim()).filter(Boolean);
  if (features.length) lines.push("Features: " + features.join(", "));
  if (words.length) lines.push("Words: " + words.join(", "));
  if ($("sentence").value.trim()) lines.push("Random sentence: " + $("sentence").value.trim());
  if ($("summary").value.trim()) lines.push("Summary: " + $("summary").value.trim());
  if (!lines.length) return null;
  return lines.map((line) => line.replace(/\n/g, " ") + "\n").join("") + "Story:\n";
}

function readNumber(id, empty) {
  const text = $(id).value.trim();
  return text === "" ? empty : Number(text);
}

async function write() {
  const s = state.settings;
  const settings = { temperature: readNumber("temperature", 0), topK: readNumber("top-k", null),
                     topP: readNumber("top-p", null) };
  const maxNew = readNumber("max-new", 200);
  try {
    checkSampling(settings);
    if (!(Number.isInteger(maxNew) && maxNew >= 1)) throw new Error(`tokens must be a whole number >= 1, got ${maxNew}`);
  } catch (err) {
    say(err.message, "error");
    return;
  }
  const request = s.requests ? requestPrompt() : null;
  const prompt = request ?? $("prompt").value;
  const promptIds = state.tokenizer.encode(prompt);
  if (promptIds.length > s.max_seq_len) {
    say(`Your prompt is ${promptIds.length} tokens long and this model reads at most ` +
        `${s.max_seq_len}: shorten it, or it would forget its own beginning.`, "error");
    return;
  }
  const ids = promptIds.length ? promptIds : [s.eot_id];  // an empty prompt starts a story
  const random = seededRandom(readNumber("seed", 0));
  state.ids = [];
  state.done = false;
  state.stop = false;
  $("write").disabled = true;
  $("stop").disabled = false;
  document.body.dataset.state = "writing";
  $("story").textContent = prompt;
  say("Writing...");
  const start = performance.now();
  try {
    for (let n = 0; n < maxNew && !state.stop; n++) {
      const window = ids.slice(-s.max_seq_len);  // the model has no positions beyond these
      const input = new state.ort.Tensor("int64", BigInt64Array.from(window, BigInt), [1, window.length]);
      const { logits } = await state.session.run({ input_ids: input });
      const next = sampleToken(logits.data, settings, random);
      ids.push(next);
      state.ids.push(next);
      if (next === s.eot_id) break;  // <|endoftext|>: the story is over
      $("story").textContent = prompt + state.tokenizer.decode(state.ids);
      const seconds = (performance.now() - start) / 1000;
      state.tokensPerSecond = state.ids.length / seconds;
      $("speed").textContent = `${state.ids.length} tokens, ${state.tokensPerSecond.toFixed(1)} tokens/s`;
    }
    say(state.stop ? "Stopped." : "Done. Change the seed or the settings and write again.");
  } catch (err) {
    say(`The model stopped with an error: ${err.message}`, "error");
  }
  state.done = true;
  document.body.dataset.state = "done";
  $("write").disabled = false;
  $("stop").disabled = true;
}

$("write").addEventListener("click", write);
$("stop").addEventListener("click", () => { state.stop = true; });
load().catch((err) => {
  say(`The model could not be loaded: ${err.message}`, "error");
  document.body.dataset.state = "failed";
});
