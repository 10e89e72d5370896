# Developer entry points. `make stack` starts the integration stack locally (no Docker); see docs/integration.md.
PYTHON ?= python3
STACK_ARGS ?=

.PHONY: test-fast stack stack-fg stack-down stack-status test-integration sanitize

stack:  ## start stand-in SGLang servers, exporters, Prometheus, Alertmanager, webhook; detached
	$(PYTHON) scripts/stack.py up --detach $(STACK_ARGS)

stack-fg:  ## the same in the foreground; Ctrl-C stops it
	$(PYTHON) scripts/stack.py up $(STACK_ARGS)

stack-status:
	$(PYTHON) scripts/stack.py status

stack-down:
	$(PYTHON) scripts/stack.py down

test-fast:  ## unit tests only: no real Prometheus, promtool, browser or serve process (tests/helpers/marker_rule.py), no `slow` test, a tenth of the property-test examples; three workers on two cores: a third of the tests' time is spent waiting on socket timeouts
	$(PYTHON) -m pytest -q -p no:cacheprovider -n 3 -m "not integration and not browser and not slow" --hypothesis-profile=fast

test-integration:  ## only the end-to-end suite
	$(PYTHON) -m pytest -m integration tests/integration

sanitize:  ## the C accelerator under AddressSanitizer + UBSan (its tests, a few minutes)
	PYTHON=$(PYTHON) scripts/sanitize_scan.sh
