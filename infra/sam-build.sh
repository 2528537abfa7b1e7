#!/usr/bin/env bash
# sam build for one architecture (default x86_64: offline-safe here; arm64 makes cargo-lambda run
# `rustup target add aarch64-unknown-linux-gnu`, which needs the internet).
# The tools venv goes first on PATH: sam finds cargo-lambda there, and cargo-lambda finds zig
# through that venv's python.
set -euo pipefail

# shellcheck source=infra/env.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/env.sh"
cd "$SAS_ROOT"

arch="${1:-x86_64}"
[ $# -gt 0 ] && shift
case "$arch" in
  x86_64 | arm64) ;;
  *) echo "usage: infra/sam-build.sh [x86_64|arm64] [sam build args...]" >&2; exit 2 ;;
esac
command -v cargo >/dev/null 2>&1 || { echo "cargo not found (rustup)" >&2; exit 1; }
"$SAS_ROOT/infra/tools.sh" install
start=$SECONDS
PATH="$TOOLS_VENV/bin:$PATH" sam build --parameter-overrides "Architecture=$arch" "$@"
echo "[sam-build] $arch built in $((SECONDS - start)) s (.aws-sam/build); deploy with the same"
echo "[sam-build] architecture, e.g. sam deploy --config-env x86_64 (samconfig.toml)"
