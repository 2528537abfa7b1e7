#!/usr/bin/env bash
# "Bring your own workflow" (docs/tutorials/bring-your-own-workflow.md): the chapter's commands, run end to end against LocalStack in
# Lambda mode. `make byow` runs it; CI runs it. Exits non-zero when any step does not do what the
# chapter says.
#
# Your services here: a Lambda function (tests/functions/byow-orders: prices an order), an HTTP API
# that accepts only SigV4-signed requests (the order service's payment routes, verifying the
# signature itself), and an HTTP API that wants an API key kept in Secrets Manager (the order
# service's shipping routes). Needs LocalStack running (infra/localstack.sh start) and the
# functions built (cargo build -p sas-functions --bins; sasctl and order-service too).
set -euo pipefail
cd "$(dirname -- "${BASH_SOURCE[0]}")/../.."
# shellcheck source=infra/env.sh
source infra/env.sh
BIN="${BIN:-target/debug}"
SASCTL="$BIN/sasctl"
RUN="byow-$(date +%s)-$$"
WORK="$(mktemp -d)"
step() { printf '\n== %s\n' "$*"; }
cleanup() {
  [ -n "${PAYMENTS_PID:-}" ] && kill "$PAYMENTS_PID" 2>/dev/null || true
  [ -n "${SHIPPING_PID:-}" ] && kill "$SHIPPING_PID" 2>/dev/null || true
  "$SASCTL" delete-local --name "$RUN" >/dev/null 2>&1 || true
  rm -rf -- "$WORK"
}
trap cleanup EXIT

step "1. Your Lambda function"
(cd tests/functions/byow-orders && python3 -m zipfile -c "$WORK/pricing.zip" bootstrap)
awslocal lambda create-function --function-name "$RUN-pricing" --runtime provided.al2023 \
  --handler bootstrap --role arn:aws:iam::000000000000:role/pricing \
  --zip-file "fileb://$WORK/pricing.zip" --query FunctionArn --output text
awslocal lambda wait function-active-v2 --function-name "$RUN-pricing"
PRICING_ARN="$(awslocal lambda get-function --function-name "$RUN-pricing" --query Configuration.FunctionArn --output text)"

step "2. Your APIs: payments (SigV4 only) and shipping (an API key from Secrets Manager)"
API_KEY="$(python3 -c 'import secrets; print(secrets.token_hex(16))')"
SECRET_ARN="$(awslocal secretsmanager create-secret --name "$RUN/shipping-api-key" \
  --secret-string "$API_KEY" --query ARN --output text)"
PAYMENTS_PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
SHIPPING_PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
SIGV4_VERIFY="dir:$HOST_LAMBDA_CREDENTIALS_DIR:execute-api" \
  "$BIN/order-service" --listen "127.0.0.1:$PAYMENTS_PORT" >"$WORK/payments.log" 2>&1 &
PAYMENTS_PID=$!
ORDER_SERVICE_API_KEY="$API_KEY" \
  "$BIN/order-service" --listen "127.0.0.1:$SHIPPING_PORT" >"$WORK/shipping.log" 2>&1 &
SHIPPING_PID=$!

step "3. Your workflow and agents (a configuration directory)"
mkdir -p "$WORK/config"
cat >"$WORK/config/workflows.json" <<JSON
{"workflows": [{
  "name": "byow", "version": 1,
  "description": "Price with your function, charge through a signed API (refund undoes it), ship through a keyed API",
  "steps": [
    {"name": "price", "agent": "pricing", "timeout_ms": 10000, "max_attempts": 3},
    {"name": "charge", "agent": "payments.charge", "timeout_ms": 10000, "max_attempts": 3,
     "compensation": {"name": "refund", "agent": "payments.refund", "timeout_ms": 10000, "max_attempts": 5}},
    {"name": "ship", "agent": "shipping.ship", "timeout_ms": 10000, "max_attempts": 3}
  ]}]}
JSON
cat >"$WORK/config/agents.json" <<JSON
{"agents": {
  "pricing": {"kind": "lambda", "function": "$PRICING_ARN"},
  "payments.charge": {"kind": "http", "url": "http://127.0.0.1:$PAYMENTS_PORT/payment/charge",
                      "sign": {"service": "execute-api"}},
  "payments.refund": {"kind": "http", "url": "http://127.0.0.1:$PAYMENTS_PORT/payment/refund",
                      "sign": {"service": "execute-api"}},
  "shipping.ship": {"kind": "http", "url": "http://127.0.0.1:$SHIPPING_PORT/shipping/ship",
                    "headers": {"X-Api-Key": {"secret": "$SECRET_ARN"}}}
}}
JSON

step "4. Validate it (first without the grants: it must say what is missing)"
if "$SASCTL" validate --workflows "$WORK/config/workflows.json" --agents "$WORK/config/agents.json" \
  >"$WORK/validate.txt" 2>&1; then
  cat "$WORK/validate.txt"; echo "validate passed without IAM grants" >&2; exit 1
fi
cat "$WORK/validate.txt"
grep -q "AgentFunctionArns" "$WORK/validate.txt"
PARAMS=(--param "AgentFunctionArns=$PRICING_ARN" --param "AgentSecretArns=$SECRET_ARN"
        --param "AgentSignedApiArns=arn:aws:execute-api:us-east-1:000000000000:payments/*")
"$SASCTL" validate --workflows "$WORK/config/workflows.json" --agents "$WORK/config/agents.json" "${PARAMS[@]}"

step "5. Deploy: the stack with its functions, your configuration as their layer (no build)"
"$SASCTL" deploy-local --name "$RUN" --outputs "$WORK/outputs.json" --functions "$BIN" \
  --config "$WORK/config" "${PARAMS[@]}"

step "6. Submit a task"
TASK="$("$SASCTL" --outputs "$WORK/outputs.json" submit --workflow byow \
  --input '{"order": "o-1001", "amount_cents": 4200, "customer": "c-7"}')"
echo "task $TASK"

step "7. Read the result"
state=none
for _ in $(seq 1 60); do
  # (the Submitter records the task a moment after the message is sent)
  if "$SASCTL" --outputs "$WORK/outputs.json" status "$TASK" --json >"$WORK/status.json" 2>/dev/null; then
    state="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["ProcessState"])' "$WORK/status.json")"
  fi
  case "$state" in Processed | Error | Cancelled) break ;; esac
  sleep 1
done
"$SASCTL" --outputs "$WORK/outputs.json" status "$TASK"
python3 - "$WORK/status.json" <<'PY'
import json, sys
task = json.load(open(sys.argv[1]))
assert task["ProcessState"] == "Processed", task["ProcessState"]
out = {s["name"]: s.get("output") for s in task["Steps"]}
assert out["price"]["handled"] == "price" and out["price"]["order"] == "o-1001", out["price"]
assert out["charge"] and out["ship"], out
print("byow: Processed; price answered by the function, charge signed, ship keyed")
PY

step "8. What your APIs refuse: unsigned, wrongly signed, keyless"
# (a key the payments API knows: the Agent function's, signed with the wrong secret)
# (sed, not head: head exits after one line and ls dies of SIGPIPE, which pipefail reports)
KNOWN_KEY="$(ls -t "$HOST_LAMBDA_CREDENTIALS_DIR" | sed -n 1p)"
python3 - "$PAYMENTS_PORT" "$SHIPPING_PORT" "$KNOWN_KEY" <<'PY'
import sys, time, urllib.error, urllib.request
payments, shipping, known_key = sys.argv[1], sys.argv[2], sys.argv[3]
def status(port, path, headers):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=b"{}", method="POST",
                                 headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
amz = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
forged = (f"AWS4-HMAC-SHA256 Credential={known_key}/{amz[:8]}/us-east-1/execute-api/aws4_request, "
          "SignedHeaders=content-type;host;idempotency-key;x-amz-date, Signature=" + "0" * 64)
for name, got, want in [
    ("unsigned", status(payments, "/payment/charge", {"Idempotency-Key": "x:1"}), 403),
    ("wrongly signed", status(payments, "/payment/charge", {"Idempotency-Key": "x:1", "X-Amz-Date": amz, "Authorization": forged}), 403),
    ("without the API key", status(shipping, "/shipping/ship", {"Idempotency-Key": "x:1"}), 401),
    ("with a wrong API key", status(shipping, "/shipping/ship", {"Idempotency-Key": "x:1", "X-Api-Key": "guess"}), 401),
]:
    print(f"{name}: HTTP {got[0]} {got[1][:100]}")
    assert got[0] == want, f"{name}: expected {want}"
PY
