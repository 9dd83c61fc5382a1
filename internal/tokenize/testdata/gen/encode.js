// Generates the encode/decode golden files of internal/tokenize with Hugging Face's own
// Rust tokenizers library (npm package "tokenizers", prebuilt native binding).
//
//   cd internal/tokenize/testdata/gen && npm ci && node encode.js [tokenizers-dir]
//
// tokenizers-dir defaults to <repo>/.cache/tokenizers (scripts/fetch-tokenizers.sh).
// For each variant of ../hf/variants.json it writes ../hf/<name>.jsonl.gz: a header line,
// then one record per input: {"text", "ids", "special_ids"?, "decoded"?, "vocab"?}
// (special_ids: encoding with add_special_tokens, when it differs; decoded: decode(ids)
// when it differs from text). Variants with "vocab": true also get every vocabulary
// entry whose bytes are valid UTF-8 as an input, and ../hf/<name>.decode.json.gz with
// decode([id]) for every id.
'use strict';

const fs = require('fs');
const path = require('path');
const zlib = require('zlib');
const crypto = require('crypto');
const { Tokenizer } = require('tokenizers');
const { corpus } = require('./corpus');

const here = __dirname;
const outDir = path.join(here, '..', 'hf');
const tokDir = process.argv[2] || path.join(here, '..', '..', '..', '..', '.cache', 'tokenizers');
const tokenizersVersion = require('tokenizers/package.json').version;

// GPT-2's byte <-> printable character table, inverted: character -> byte.
function byteLevelDecoder() {
  const bs = [];
  for (let b = 0x21; b <= 0x7e; b++) bs.push(b);
  for (let b = 0xa1; b <= 0xac; b++) bs.push(b);
  for (let b = 0xae; b <= 0xff; b++) bs.push(b);
  const cs = bs.slice();
  let n = 0;
  for (let b = 0; b < 256; b++) {
    if (!bs.includes(b)) {
      bs.push(b);
      cs.push(256 + n);
      n++;
    }
  }
  const m = new Map();
  bs.forEach((b, i) => m.set(String.fromCodePoint(cs[i]), b));
  return m;
}

function applyVariant(base, v) {
  const cfg = JSON.parse(JSON.stringify(base));
  for (const [k, val] of Object.entries(v.set || {})) cfg[k] = val;
  for (const [content, fields] of Object.entries(v.added_tokens_set || {})) {
    const tok = cfg.added_tokens.find((t) => t.content === content);
    if (!tok) throw new Error(`variant ${v.name}: no added token ${content}`);
    Object.assign(tok, fields);
  }
  for (const tok of v.added_tokens_append || []) cfg.added_tokens.push(tok);
  return cfg;
}

const sameIds = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);

async function record(tok, text, extra) {
  const plain = await tok.encode(text, null, { addSpecialTokens: false });
  const special = await tok.encode(text, null, { addSpecialTokens: true });
  const ids = Array.from(plain.getIds());
  const sids = Array.from(special.getIds());
  const decoded = await tok.decode(ids, false);
  const rec = { text, ids };
  if (!sameIds(ids, sids)) rec.special_ids = sids;
  if (decoded !== text) rec.decoded = decoded;
  return Object.assign(rec, extra);
}

async function main() {
  const variants = JSON.parse(fs.readFileSync(path.join(outDir, 'variants.json'), 'utf8'));
  const texts = corpus();
  const unique = new Set(texts);
  if (unique.size !== texts.length) throw new Error(`corpus has ${texts.length - unique.size} duplicate strings`);
  const bl = byteLevelDecoder();
  const utf8 = new TextDecoder('utf-8', { fatal: true });

  for (const v of variants) {
    const file = path.join(tokDir, v.base, 'tokenizer.json');
    const raw = fs.readFileSync(file);
    const cfg = applyVariant(JSON.parse(raw.toString('utf8')), v);
    const tok = Tokenizer.fromString(JSON.stringify(cfg));
    const lines = [JSON.stringify({
      variant: v.name,
      base: v.base,
      base_sha256: crypto.createHash('sha256').update(raw).digest('hex'),
      generator: `tokenizers@${tokenizersVersion} (npm)`,
    })];
    for (const text of texts) lines.push(JSON.stringify(await record(tok, text)));
    let vocabInputs = 0;
    if (v.vocab) {
      const vocab = Object.entries(tok.getVocab(true)).sort((a, b) => a[1] - b[1]);
      for (const [token, id] of vocab) {
        let text;
        if (cfg.added_tokens.some((t) => t.id === id)) {
          text = token;
        } else {
          const bytes = Array.from(token, (c) => bl.get(c));
          if (bytes.some((b) => b === undefined)) throw new Error(`token ${id} is not byte-level`);
          try {
            text = utf8.decode(Uint8Array.from(bytes));
          } catch {
            continue; // a partial UTF-8 sequence: no string holds exactly these bytes
          }
        }
        if (unique.has(text)) continue;
        lines.push(JSON.stringify(await record(tok, text, { vocab: id })));
        vocabInputs++;
      }
      const size = tok.getVocabSize(true);
      const singles = [];
      const batch = 4096;
      for (let start = 0; start < size; start += batch) {
        const ids = [];
        for (let id = start; id < Math.min(size, start + batch); id++) ids.push([id]);
        singles.push(...(await tok.decodeBatch(ids, false)));
      }
      fs.writeFileSync(path.join(outDir, `${v.name}.decode.json.gz`), zlib.gzipSync(JSON.stringify(singles), { level: 9 }));
    }
    fs.writeFileSync(path.join(outDir, `${v.name}.jsonl.gz`), zlib.gzipSync(lines.join('\n') + '\n', { level: 9 }));
    console.log(`${v.name}: ${texts.length} corpus strings, ${vocabInputs} vocabulary entries`);
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
