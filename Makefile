# Entry points; the logic lives in infra/*.sh (see infra/NOTES.md).
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c

ARGS ?=

.PHONY: demo demo-local up down check validate sim lambda-smoke lambda-check test-lambda byow localstack-install localstack-start localstack-stop localstack-status tools lint sam-build sam-deploy-local sam-local-invoke docker-stop stack-smoke test

demo: ## the main job on the real functions: LocalStack, the stack with its 5 Lambda functions, the order service, sample orders (synchronous and asynchronous), a summary (sas-dev demo)
	SAS_MODE=lambda infra/demo.sh

demo-local: ## the same orders with every role in one process (the local runner; functions off): fastest to iterate (sas-dev demo)
	SAS_MODE=local infra/demo.sh

up: ## LocalStack + stack sas-local + order service + local runner in the background (.local/outputs.json)
	infra/up.sh

down: ## stop the local runner, the order service and LocalStack
	infra/down.sh

.PHONY: ui
ui: ## sasctl ui, the console in the browser, on the last demo's stack (else make up's): http://127.0.0.1:8080/ until Ctrl-C (ARGS='--read-only')
	ARGS="$(ARGS)" infra/ui.sh

.PHONY: bench-console
bench-console: ## benchmark of sasctl ui's task listing on its own stack: 10,000 ended tasks, the requests and time per page (BENCH_N, BENCH_PAGES)
	source infra/env.sh && infra/localstack.sh ensure && cargo build -q --workspace --examples && target/debug/examples/console_bench --tasks "$(or $(BENCH_N),10000)" --pages "$(or $(BENCH_PAGES),20)"

.PHONY: load
load: ## benchmark on make up's stack: N sim-order tasks (N=1000), drain time, throughput, latency, final states (sas-dev load)
	N="$(or $(N),1000)" ARGS="$(ARGS)" infra/load.sh

.PHONY: bench-cost bench-sweep
bench-cost: ## cost benchmark on its own stack sas-bench: AWS requests, DynamoDB RCU/WCU (table and each index) and $ per million tasks, 12 workloads (BENCH_N=200; BENCH_ONLY=3,6 picks; 9-11 are three translated Step Functions state machines, 12 a loop of 100 iterations; SWEEP=1 adds bench-sweep); see bench/README.md
	SWEEP="$(or $(SWEEP),0)" bench/cost.sh

bench-sweep: ## the supervisor sweep's requests and read units with 100,000 finished tasks in the table and 0/10/100 expired ones (SWEEP_FINISHED)
	bench/cost.sh sweep

.PHONY: docs
docs: ## the book: README.md's relative links checked, the contents lists of docs/index.md and README.md checked against mkdocs.yml's nav, the shipped configuration checked against schemas/, then docs/ built with MkDocs (docs/requirements.txt, venv .local/docs-venv) in --strict mode into .local/site
	python3 docs/check-readme-links.py
	[ -x .local/docs-venv/bin/pip ] || python3 -m venv .local/docs-venv
	.local/docs-venv/bin/pip install -q --disable-pip-version-check -r docs/requirements.txt
	.local/docs-venv/bin/python docs/check-contents.py
	.local/docs-venv/bin/python docs/check-schemas.py
	.local/docs-venv/bin/mkdocs build --strict --site-dir .local/site

check: ## cargo fmt --check and cargo clippy (workspace lints, pedantic) with warnings as errors
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings

validate: ## sasctl validate on config/ (workflows + agents) with the variables the template gives the Agent function; ARGS=--workflows F --agents F for yours
	cargo build -q --workspace --bins
	"$${CARGO_TARGET_DIR:-target}/debug/sasctl" validate --var ORDER_SERVICE_URL=http://order-service.invalid \
	  --var APPROVAL_TOPIC_ARN=arn:aws:sns:us-east-1:000000000000:sas-approvals \
	  --var DEFAULT_EVENT_BUS_ARN=arn:aws:events:us-east-1:000000000000:event-bus/default $(ARGS)

sim: ## the deterministic simulation of the whole system: SIM_SEEDS seeds (default 2000); SIM_SEED=n replays one
	SIM_SEEDS=$${SIM_SEEDS:-2000} cargo test --workspace --test simulation -- --nocapture

lambda-smoke: ## build the five function binaries and boot each under the host Lambda executor's Runtime API server
	infra/lambda-smoke.sh

lambda-check: ## the host Lambda executor's checks against the running LocalStack (infra/localstack.sh start first)
	infra/lambda-check.sh

localstack-install: ## install LocalStack 4.13.1 + DynamoDB Local into .local/localstack
	infra/localstack.sh install

localstack-start: ## start LocalStack in the background (installs first if needed)
	infra/localstack.sh ensure

localstack-stop:
	infra/localstack.sh stop

localstack-status:
	infra/localstack.sh status

tools: ## sam, cfn-lint, cargo-lambda, awslocal into .local/tools/venv
	infra/tools.sh install

lint: ## sam validate --lint, cfn-lint, checkov, ruff on the Python (ruff.toml), shellcheck when installed
	infra/lint.sh

.PHONY: test-python
test-python: ## the project's Python unit tests with pytest (Lambda executor, lambda-smoke harness, cost benchmark; no LocalStack, a few seconds; ARGS go to pytest)
	infra/test-python.sh $(ARGS)

sam-build: ## sam build for x86_64, samconfig.toml's default (arm64 needs rustup's aarch64 target: infra/sam-build.sh arm64)
	infra/sam-build.sh x86_64

sam-deploy-local: ## SAM's own deploy of sam build's output to LocalStack (functions on), sasctl smoke to Processed, samlocal delete
	infra/sam-deploy-local.sh

sam-local-invoke: ## sam local invoke of all five functions (sam build's output) in Docker against LocalStack, each fed a real message, checked (root: own dockerd)
	infra/sam-local-invoke.sh

docker-stop: ## stop the project's own Docker engine (infra/docker.sh)
	infra/docker.sh stop

stack-smoke: ## deploy template.yaml on LocalStack, read back what it promises (indexes, TTL, redrive, KMS), delete it
	infra/test.sh the_deployed_template

test: ## cargo tests against LocalStack (started and stopped here if it was not running), Lambda mode aside
	infra/test.sh $(ARGS)

byow: ## the book's "Bring your own workflow" tutorial (docs/tutorials/bring-your-own-workflow.md), end to end on LocalStack in Lambda mode (examples/byow/walkthrough.sh)
	cargo build -q --workspace --bins
	infra/localstack.sh ensure
	examples/byow/walkthrough.sh

test-lambda: ## the Lambda-mode tests: stacks with the functions on, driven through LocalStack's event sources, rule and Invoke
	infra/test-lambda.sh $(ARGS)
