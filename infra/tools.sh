#!/usr/bin/env bash
# Developer tools, pinned, in two venvs under .local/tools/:
# - venv: aws-sam-cli, samlocal, awslocal (+ aws CLI v1 via localstack-client deps), cargo-lambda
#   (+ zig), cfn-lint, and ruff and pytest for the project's Python (infra/requirements-tools.txt).
#   cargo-lambda must sit in the same venv as sam, or sam build cannot find zig.
# - checkov-venv: checkov (infra/requirements-checkov.txt); its pins clash with the first venv.
#
#   infra/tools.sh install        create/update both venvs (idempotent, one stamp per venv)
#   infra/tools.sh exec CMD ARGS  run CMD with the tools venv's bin first on PATH
#   infra/tools.sh path           print the tools venv's bin folder
#   infra/tools.sh checkov ARGS   run checkov from its venv
set -euo pipefail

# shellcheck source=infra/env.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/env.sh"

readonly INSTALL_REV=1
PYTHON="${PYTHON:-python3}"

log() { printf '[tools] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

stamp_content() { # requirements-file
  printf 'rev=%s\nrequirements=%s\n' "$INSTALL_REV" "$(sha256sum "$1" | cut -d' ' -f1)"
}

# install_venv VENV REQUIREMENTS STAMP COMMAND-THAT-MUST-RUN...
install_venv() {
  local venv="$1" requirements="$2" stamp="$3" start pyver
  shift 3
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$(stamp_content "$requirements")" ] && [ -x "$venv/bin/$1" ]; then
    log "already installed (${venv#"$SAS_ROOT"/}); delete $stamp to force a reinstall"
    return 0
  fi
  start=$SECONDS
  command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found"
  pyver="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
  if [ "$pyver" != "3.11" ]; then
    log "warning: $PYTHON is $pyver; the pinned lists were resolved for CPython 3.11"
  fi
  rm -f -- "$stamp"
  if [ ! -x "$venv/bin/python" ]; then
    log "creating venv $venv ($PYTHON $pyver)"
    "$PYTHON" -m venv "$venv"
  fi
  log "pip install -r ${requirements#"$SAS_ROOT"/} (pinned)"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --prefer-binary -r "$requirements"
  "$venv/bin/$1" "${@:2}" >/dev/null
  stamp_content "$requirements" >"$stamp"
  log "installed ${venv#"$SAS_ROOT"/} in $((SECONDS - start)) s ($(du -sh "$venv" | cut -f1))"
}

install_tools() {
  install_venv "$TOOLS_VENV" "$SAS_ROOT/infra/requirements-tools.txt" "$SAS_LOCAL_DIR/tools/.installed" \
    sam --version
  "$TOOLS_VENV/bin/cargo-lambda" lambda --version >/dev/null
  "$TOOLS_VENV/bin/cfn-lint" --version >/dev/null
  "$TOOLS_VENV/bin/ruff" --version >/dev/null
  "$TOOLS_VENV/bin/pytest" --version >/dev/null
}

install_checkov() {
  install_venv "$CHECKOV_VENV" "$SAS_ROOT/infra/requirements-checkov.txt" \
    "$SAS_LOCAL_DIR/tools/.installed-checkov" checkov --version
}

cmd_install() {
  # The two venvs are independent: install them side by side (pip waits on the network a lot).
  local tools_pid checkov_pid rc=0
  mkdir -p -- "$SAS_LOCAL_DIR/tools"
  install_tools &
  tools_pid=$!
  install_checkov &
  checkov_pid=$!
  wait "$tools_pid" || rc=$?
  wait "$checkov_pid" || rc=$?
  [ "$rc" -eq 0 ] || die "install failed (exit $rc)"
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
    checkov)
      [ -x "$CHECKOV_VENV/bin/checkov" ] || die "checkov not installed: run infra/tools.sh install (make tools)"
      exec "$CHECKOV_VENV/bin/checkov" "$@"
      ;;
    *) sed -n '2,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
  esac
}

main "$@"
