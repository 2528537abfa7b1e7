#!/usr/bin/env bash
# Developer tools in one venv, .local/tools/venv: aws-sam-cli, samlocal, awslocal (+ aws CLI v1 via
# localstack-client deps), cargo-lambda (+ zig) and cfn-lint, pinned in infra/requirements-tools.txt.
# cargo-lambda must sit in the same venv as sam, or sam build cannot find zig.
#
#   infra/tools.sh install        create/update the venv (idempotent, stamped)
#   infra/tools.sh exec CMD ARGS  run CMD with the venv's bin first on PATH
#   infra/tools.sh path           print the venv's bin folder
set -euo pipefail

# shellcheck source=infra/env.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/env.sh"

readonly REQUIREMENTS="$SAS_ROOT/infra/requirements-tools.txt"
readonly STAMP="$SAS_LOCAL_DIR/tools/.installed"
readonly INSTALL_REV=1
PYTHON="${PYTHON:-python3}"

log() { printf '[tools] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

stamp_content() {
  printf 'rev=%s\nrequirements=%s\n' "$INSTALL_REV" "$(sha256sum "$REQUIREMENTS" | cut -d' ' -f1)"
}

cmd_install() {
  local start pyver
  if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(stamp_content)" ] && [ -x "$TOOLS_VENV/bin/sam" ]; then
    log "already installed (${TOOLS_VENV#"$SAS_ROOT"/}); delete $STAMP to force a reinstall"
    return 0
  fi
  start=$SECONDS
  command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found"
  pyver="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
  if [ "$pyver" != "3.11" ]; then
    log "warning: $PYTHON is $pyver; the pinned list was resolved for CPython 3.11"
  fi
  rm -f -- "$STAMP"
  if [ ! -x "$TOOLS_VENV/bin/python" ]; then
    log "creating venv $TOOLS_VENV ($PYTHON $pyver)"
    "$PYTHON" -m venv "$TOOLS_VENV"
  fi
  log "pip install -r ${REQUIREMENTS#"$SAS_ROOT"/} (pinned)"
  "$TOOLS_VENV/bin/python" -m pip install --quiet --disable-pip-version-check --prefer-binary \
    -r "$REQUIREMENTS"
  "$TOOLS_VENV/bin/sam" --version >/dev/null
  "$TOOLS_VENV/bin/cargo-lambda" lambda --version >/dev/null
  "$TOOLS_VENV/bin/cfn-lint" --version >/dev/null
  stamp_content >"$STAMP"
  log "installed in $((SECONDS - start)) s (venv $(du -sh "$TOOLS_VENV" | cut -f1))"
}

main() {
  local cmd="${1:-}"
  [ $# -gt 0 ] && shift
  case "$cmd" in
    install) cmd_install ;;
    exec)
      [ $# -gt 0 ] || die "usage: infra/tools.sh exec CMD [ARGS...]"
      [ -x "$TOOLS_VENV/bin/sam" ] || die "tools not installed: run infra/tools.sh install (make tools)"
      PATH="$TOOLS_VENV/bin:$PATH" exec "$@"
      ;;
    path) printf '%s\n' "$TOOLS_VENV/bin" ;;
    *) sed -n '2,8p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
  esac
}

main "$@"
