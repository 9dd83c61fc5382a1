#!/usr/bin/env bash
# The demo needs the indexer, which is not built yet (see the open issues).
echo "make demo: not yet — the indexer binary is not built yet; see README 'Status'."
