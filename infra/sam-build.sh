#!/usr/bin/env bash
# sam build for one architecture, through samconfig.toml's config env of that name (x86_64 is the
# default env; arm64 makes cargo-lambda run `rustup target add aarch64-unknown-linux-gnu`, which
# needs the internet). Deploy with the same config env, which pins the same Architecture.
# The tools venv goes first on PATH: sam finds cargo-lambda there, and cargo-lambda finds zig
# through that venv's python.
set -euo pipefail

# shellcheck source=infra/env.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/env.sh"
cd "$SAS_ROOT"

# --if-missing: build only when there is no sam build output yet (the SAM targets that use it).
if [ "${1:-}" = --if-missing ]; then
  shift
  if [ -f .aws-sam/build/template.yaml ]; then
    "$SAS_ROOT/infra/tools.sh" install >/dev/null
    exit 0
  fi
  echo "[sam-build] no sam build output (.aws-sam/build): building" >&2
fi
arch="${1:-x86_64}"
[ $# -gt 0 ] && shift
case "$arch" in
  x86_64 | arm64) ;;
  *) echo "usage: infra/sam-build.sh [--if-missing] [x86_64|arm64] [sam build args...]" >&2; exit 2 ;;
esac
command -v cargo >/dev/null 2>&1 || { echo "cargo not found (rustup)" >&2; exit 1; }
"$SAS_ROOT/infra/tools.sh" install
start=$SECONDS
env=default
[ "$arch" = arm64 ] && env=arm64
PATH="$TOOLS_VENV/bin:$PATH" sam build --config-env "$env" "$@"
echo "[sam-build] $arch built in $((SECONDS - start)) s (.aws-sam/build); deploy with the same"
echo "[sam-build] config env: sam deploy --config-env $env (samconfig.toml)"
