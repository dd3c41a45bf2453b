// Runs the page's tokenizer and sampler under node for tests/test_web.py: reads a JSON job on
// stdin, writes the JavaScript answers as JSON on stdout, which the test compares with Python.
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const job = JSON.parse(readFileSync(0, "utf8"));
const page = (name) => import(pathToFileURL(`${job.page}/${name}`).href);
const { Tokenizer } = await page("tokenizer.js");
const { nextTokenProbs, sampleToken, seededRandom } = await page("sampler.js");

const tokenizer = new Tokenizer(JSON.parse(readFileSync(job.tokenizer, "utf8")));
const answer = {
  encoded: job.texts.map((text) => tokenizer.encode(text)),
  decoded: job.ids.map((ids) => tokenizer.decode(ids)),
  decodedSpecial: job.ids.map((ids) => tokenizer.decode(ids, false)),
  probs: job.sampling.map(({ logits, settings }) =>
    Array.from(nextTokenProbs(Float32Array.from(logits), settings))),
  draws: job.sampling.map(({ logits, settings }) => {
    const random = seededRandom(job.seed);
    return Array.from({ length: 5 }, () => sampleToken(Float32Array.from(logits), settings, random));
  }),
};
process.stdout.write(JSON.stringify(answer));
