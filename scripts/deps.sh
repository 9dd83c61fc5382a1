#!/usr/bin/env bash
# Installs the system packages kvindex needs to build and test (libzmq for pebbe/zmq4,
# pkg-config for cgo, npm for test fixtures, python3 for the Python client, chromium
# for the console's browser tests) when missing. Idempotent; a no-op on a machine that has them.
set -euo pipefail

need=()
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
if ! pkg-config --exists libzmq 2>/dev/null; then need+=(libzmq3-dev); fi
command -v gcc >/dev/null 2>&1 || need+=(gcc)
# npm fetches the real tokenizer files the tokenize tests compare against;
# python3 runs the stdlib-only Python client's tests.
command -v npm >/dev/null 2>&1 || need+=(npm)
command -v python3 >/dev/null 2>&1 || need+=(python3)
# Debian's chromium runs the consoles' end-to-end browser tests (they fail without it).
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || [ -n "${KVINDEX_CHROMIUM:-}" ] || need+=(chromium)
# promtool (Debian's prometheus package) checks deploy/prometheus's alert rules.
command -v promtool >/dev/null 2>&1 || need+=(prometheus)

if [ ${#need[@]} -gt 0 ]; then
  echo "deps: installing ${need[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi

if ! command -v go >/dev/null 2>&1; then
  echo "deps: Go is required (1.26+); see https://go.dev/doc/install" >&2
  exit 1
fi
