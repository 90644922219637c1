# sgdeploy: Blackwell hosts → a gated, measured SGLang speculative-decoding service.
# `make help` lists the targets. Every target sets up .venv itself when needed.
#
# Variables a user sets (CONFIG, INVENTORY, LIMIT, ...; USER_VARS below) reach recipes only as
# environment variables, quoted in the shell ("$$CONFIG"), never as recipe text: a value with
# `;`, backticks or `$(...)` is one argument, never a command. Keep it so in new targets:
# write "$$CONFIG", not $(CONFIG), in a recipe (tests/unit/tool/test_makefile.py checks).
#
# Every target that touches hosts first checks that its plays have hosts to run on (need_hosts:
# `sgdeploy hosts`): a missing or unparsable inventory, an empty gpu_hosts group, or a LIMIT/HOST that
# matches no host of it stops with one line, exit 2, before any play runs.
#
# The variables a user sets; `make help` prints these lines (one per variable):
#: CONFIG=NAME         a config from configs/ (e.g. ddtree-b15) or the path of a .yml file
#: INVENTORY=FILE      Ansible inventory with the hosts in group gpu_hosts (default: the lab, brought up)
#: LIMIT=PATTERN       only these hosts of gpu_hosts (an Ansible --limit pattern, e.g. gpu-01)
#: SERIAL=N|P%         hosts deployed or rolled back at a time: a whole number from 1, or 1% to 100% (default 1)
#: MAX_UNAVAILABLE=N|P% fleet router (inventory group routers): engines out at once after the canary (default 1)
#: HOST=NAME           gate, sweep: the host (default: the first of gpu_hosts); reference: only this host
#: BUDGETS="8 15 ..."  sweep: the DDTree budgets to test (default "8 15 16 32 64")
#: TOPK_CAPS="4 8"     sweep: the top-k caps to test (default: the config's cap)
#: CLIFF_DROP=0.25     sweep: the acceptance drop (a fraction) that marks the cliff (default 0.25)
#: TIE_TOLERANCE=0.03  sweep: tokens/s within this fraction of the fastest is a tie (default 0.03)
#: BATCHES="1 4 8 16"  sweep: also bench each budget at these batch sizes and derive a budget schedule
#: REPLACES=a,b        deploy, plan, rollback: the other configs it may stop or displace (a shared port, NCCL port or GPU)
#: DRAIN=1            provision: drain (stop) the services of hosts that serve before a reboot (default: refuse)
#: VERBOSE=1           show skipped tasks too (the output hides them by default)
#: PATCHES=a,b         wheel: build these patch features instead of CONFIG's (e.g. ddtree,fork)
#: PATCH=NAME          patch-work: stop at this patch; patch-diff: the patch to write back
#: LAB_HOSTS=2         lab: how many hosts lab1..labN (1 to 50)
#: LAB_NET=127.0.1     lab: host N is LAB_NET.N (inside 127.0.0.0/8, not 127.0.0)
#: LAB_DIR=build/lab   lab: its folder (hosts, ssh key, apt repository)
#: LAB_INVENTORY=FILE  lab: the inventory lab-up writes (default inventory/lab.yml)
#: LAB_GPU_COUNTS="8"  lab: GPUs per host, space-separated (missing entries are 8)
#: LAB_CACHE=DIR       lab: the shared root filesystem cache (default build/lab-cache)

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

VENV        ?= .venv
PY          := $(VENV)/bin/python
STAMP       := $(VENV)/.installed
# The programs the recipes run (tests replace them with recorders).
SGDEPLOY    := $(VENV)/bin/sgdeploy
ANSIBLE_PLAYBOOK := $(VENV)/bin/ansible-playbook
PYTEST      := $(PY) -m pytest
CONFIG      ?=
INVENTORY   ?=
LIMIT       ?=
SERIAL      ?= 1
MAX_UNAVAILABLE ?=
LAB_HOSTS   ?= 2
LAB_INVENTORY ?= inventory/lab.yml
BUDGETS     ?= 8 15 16 32 64
TOPK_CAPS   ?=
CLIFF_DROP  ?=
TIE_TOLERANCE ?=
BATCHES ?=
HOST        ?=
PATCHES     ?=
PATCH       ?=
DRAIN       ?=
VERBOSE     ?=
REPLACES    ?=

# Take every user variable's text as it is (make never expands a `$(...)` in it), and hand it to
# the recipes' environment.
USER_VARS := CONFIG INVENTORY LIMIT SERIAL MAX_UNAVAILABLE LAB_HOSTS LAB_INVENTORY BUDGETS TOPK_CAPS CLIFF_DROP \
             TIE_TOLERANCE BATCHES HOST PATCHES PATCH DRAIN VERBOSE REPLACES
$(foreach v,$(USER_VARS),$(eval override $(v) := $$(value $(v))))

# No INVENTORY: the lab (brought up when absent).
ifeq ($(strip $(INVENTORY)),)
  INV := $(LAB_INVENTORY)
  USE_LAB := 1
else
  INV := $(INVENTORY)
  USE_LAB :=
endif
export $(USER_VARS) INV
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
ifneq ($(strip $(VERBOSE)),)
  export ANSIBLE_DISPLAY_SKIPPED_HOSTS := true
endif
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

# Shell snippets. LIMIT_ARG: `--limit "$LIMIT,localhost"` when LIMIT is set (two words, the value intact;
# localhost so that the controller's plays, config checks and summaries, still run under LIMIT=).
LIMIT_ARG := $${LIMIT:+--limit "$$LIMIT,localhost"}
# REPLACES_ARG: `-e "replaces=$REPLACES"` when REPLACES is set (two words, the value intact).
REPLACES_ARG := $${REPLACES:+-e "replaces=$$REPLACES"}
# FLEET_ARG: `-e "fleet_max_unavailable=$MAX_UNAVAILABLE"` when set (the fleet router's batch size; the role's
# default is 1; checked by the fleet's plan before any host is touched, docs/router.md).
FLEET_ARG := $${MAX_UNAVAILABLE:+-e "fleet_max_unavailable=$$MAX_UNAVAILABLE"}
# A config is a name from configs/ or the path of a YAML file; anything else stops here (exit 2)
# before any program runs.
CONFIG_ALLOWED := a config name from configs/ (lower-case letters, digits, '.', '_', '-'; e.g. ddtree-b15) \
                  or the path of a .yml/.yaml file (letters, digits, '.', '_', '-', '+', '/')
define check_config
	@if ! [[ "$$CONFIG" =~ ^[a-z0-9][a-z0-9._-]*$$ || "$$CONFIG" =~ ^[A-Za-z0-9._+/-]+\.ya?ml$$ ]]; then \
	  echo "CONFIG='$$CONFIG' is not allowed: use $(CONFIG_ALLOWED)" >&2; exit 2; fi
endef

define need_config
	@if [ -z "$$CONFIG" ]; then echo "CONFIG is required, e.g. make $@ CONFIG=ddtree-b15 (configs: $$(ls configs | sed 's/\.yml$$//' | tr '\n' ' '))" >&2; exit 2; fi
	$(check_config)
endef

# CONFIG is optional (validate, verify): checked when given.
define maybe_config
	@if [ -n "$$CONFIG" ] && ! [[ "$$CONFIG" =~ ^[a-z0-9][a-z0-9._-]*$$ || "$$CONFIG" =~ ^[A-Za-z0-9._+/-]+\.ya?ml$$ ]]; then \
	  echo "CONFIG='$$CONFIG' is not allowed: use $(CONFIG_ALLOWED)" >&2; exit 2; fi
endef

# SERIAL (deploy, rollback): a whole number from 1 or a percentage from 1% to 100%, checked before anything runs.
define check_serial
	@if ! [[ "$$SERIAL" =~ ^[1-9][0-9]*$$ || "$$SERIAL" =~ ^([1-9][0-9]?|100)%$$ ]]; then \
	  echo "SERIAL='$$SERIAL' is not allowed: use a whole number of hosts at a time from 1 (e.g. SERIAL=2)" \
	       "or a percentage from 1% to 100% (e.g. SERIAL=25%)" >&2; exit 2; fi
endef

# The plays have hosts to run on (one line and exit 2 otherwise; see the header). need_hosts: LIMIT
# narrows gpu_hosts; need_host: HOST does (gate, sweep); need_host_or_limit: HOST, else LIMIT (reference).
define need_hosts
	@$(SGDEPLOY) hosts -q --inventory "$$INV" $${LIMIT:+--limit "$$LIMIT" --limit-name LIMIT}
endef
define need_host
	@$(SGDEPLOY) hosts -q --inventory "$$INV" $${HOST:+--limit "$$HOST" --limit-name HOST}
endef
define need_host_or_limit
	@if [ -n "$$HOST" ]; then $(SGDEPLOY) hosts -q --inventory "$$INV" --limit "$$HOST" --limit-name HOST; \
	 else $(SGDEPLOY) hosts -q --inventory "$$INV" $${LIMIT:+--limit "$$LIMIT" --limit-name LIMIT}; fi
endef

define ensure_lab
	@if [ -n "$(USE_LAB)" ]; then \
	  echo "No INVENTORY given: using the lab ($$LAB_INVENTORY), bringing it up if needed."; \
	  $(PY) tests/lab/lab.py up >/dev/null; \
	fi
endef

# promtool, the real Prometheus rule checker the unit tests run on the rendered alert rules (`sgdeploy rules`,
# tests/unit/tool/test_monitoring_rules.py): Debian 12's prometheus package, pinned by URL and sha256, is
# downloaded once into build/downloads/ and only promtool is unpacked from it (dpkg-deb; nothing is installed).
# The pool keeps a Debian package only while it is current: when the pinned one is gone (a point release
# replaced it) or the machine is not amd64, apt's own prometheus is taken (`apt-get download`, checked against
# apt's signed index) and one line says which version; bump the pin then. A wrong sha256 is never accepted.
PROMETHEUS_DEB_VERSION := 2.42.0+ds-5+deb12u1
PROMETHEUS_DEB_URL     := http://deb.debian.org/debian/pool/main/p/prometheus/prometheus_2.42.0%2Bds-5%2Bdeb12u1_amd64.deb
PROMETHEUS_DEB_SHA256  := 81d59a24fce84f7fbe97a45a4f2914b6a5881b5cd1db2a6a0e129e515e1a5f55
PROMTOOL               := build/tools/promtool

.PHONY: help setup lint sanity test test-unit test-slow test-lab test-slow-lab config render validate wheel deploy gate rollback \
        status monitoring provision build verify sweep lab-up lab-down lab-status clean promtool

help: ## List the targets and the variables a user sets
	@echo "Targets:"
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'
	@echo "Variables (make TARGET VAR=value):"
	@sed -n 's/^#: /  /p' $(MAKEFILE_LIST)

$(STAMP): requirements.txt pyproject.toml
	@command -v systemd-analyze >/dev/null || { apt-get update -qq && apt-get install -y -qq systemd >/dev/null; }
	@python3 -c 'import ensurepip' 2>/dev/null || { apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null; }
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -e .
	@touch $@

setup: $(STAMP) ## Create .venv with the pinned Python dependencies and the `sgdeploy` command (other targets do it for you)

config: $(STAMP) ## Print the fully merged config: make config CONFIG=ddtree-b15
	$(need_config)
	@$(SGDEPLOY) config "$$CONFIG"

validate: $(STAMP) ## Validate every config in configs/ (or CONFIG=...)
	$(maybe_config)
	@$(SGDEPLOY) validate $${CONFIG:+"$$CONFIG"}

render: $(STAMP) ## Render the unit + env file to build/render/<config>/: make render CONFIG=...
	$(need_config)
	@$(SGDEPLOY) render "$$CONFIG"

wheel: $(STAMP) ## Build the patched SGLang wheel for CONFIG (or PATCHES=ddtree,fork) into build/wheels/
	@if [ -z "$$PATCHES" ] && [ -z "$$CONFIG" ]; then echo "CONFIG or PATCHES is required, e.g. make wheel CONFIG=ddtree-b15" >&2; exit 2; fi
	$(maybe_config)
	@if [ -n "$$PATCHES" ]; then $(SGDEPLOY) wheel --features "$$PATCHES"; else $(SGDEPLOY) wheel --config "$$CONFIG"; fi

deploy: $(STAMP) ## Deploy CONFIG with gates and automatic rollback [INVENTORY= LIMIT= SERIAL= REPLACES=]
	$(check_serial)
	$(need_config)
	@$(SGDEPLOY) validate "$$CONFIG" >/dev/null
	$(ensure_lab)
	$(need_hosts)
	$(ANSIBLE_PLAYBOOK) -i "$$INV" $(LIMIT_ARG) playbooks/deploy.yml -e config="$$CONFIG" -e deploy_serial="$$SERIAL" $(FLEET_ARG) $(REPLACES_ARG)

gate: $(STAMP) ## Run CONFIG's gates from the controller through an SSH tunnel [HOST= INVENTORY=]
	$(need_config)
	$(ensure_lab)
	$(need_host)
	@$(SGDEPLOY) gate "$$CONFIG" --inventory "$$INV" $${HOST:+--host "$$HOST"}

rollback: $(STAMP) ## Go back by hand to the previous deploy of CONFIG (replicas one at a time through the router) [INVENTORY= LIMIT= SERIAL= REPLACES=]
	$(check_serial)
	$(need_config)
	$(ensure_lab)
	$(need_hosts)
	$(ANSIBLE_PLAYBOOK) -i "$$INV" $(LIMIT_ARG) playbooks/rollback.yml -e config="$$CONFIG" -e rollback_serial="$$SERIAL" $(FLEET_ARG) $(REPLACES_ARG)

monitoring: $(STAMP) ## Prometheus on the inventory's group monitoring + the metrics exporter on every GPU host (docs/monitoring.md) [INVENTORY=]
	$(ensure_lab)
	@$(SGDEPLOY) hosts -q --inventory "$$INV"
	$(ANSIBLE_PLAYBOOK) -i "$$INV" playbooks/monitoring.yml

status: $(STAMP) ## Show what serves on each host now, then the deploy history with gate numbers [INVENTORY= LIMIT=]
	$(ensure_lab)
	$(need_hosts)
	$(ANSIBLE_PLAYBOOK) -i "$$INV" $(LIMIT_ARG) playbooks/status.yml

provision: $(STAMP) ## Provision NVIDIA driver + CUDA [INVENTORY= LIMIT= DRAIN=1: drain and reboot hosts that serve]
	$(ensure_lab)
	$(need_hosts)
	$(ANSIBLE_PLAYBOOK) -i "$$INV" $(LIMIT_ARG) playbooks/provision.yml -e provision_allow_drain="$${DRAIN:-0}"

build: $(STAMP) ## Build the wheel for CONFIG and install the release on the hosts [INVENTORY= LIMIT=]
	$(need_config)
	$(ensure_lab)
	$(need_hosts)
	$(ANSIBLE_PLAYBOOK) -i "$$INV" $(LIMIT_ARG) playbooks/build.yml -e config="$$CONFIG"

# The GPU hosts, and the fleet router's host(s) of the group routers where the inventory has one (router checks only).
verify: $(STAMP) ## Run the testinfra checks in tests/infra/ against INVENTORY (gpu_hosts and routers)
	$(maybe_config)
	$(ensure_lab)
	@$(SGDEPLOY) hosts -q --inventory "$$INV"
	$(PYTEST) -p no:cacheprovider tests/infra --hosts=ansible://gpu_hosts,ansible://routers --ansible-inventory="$$INV" \
		$${CONFIG:+--config="$$CONFIG"}

sweep: $(STAMP) ## Sweep CONFIG over BUDGETS (and TOPK_CAPS) on one host; report in reports/sweeps/
	$(need_config)
	$(ensure_lab)
	$(need_host)
	$(SGDEPLOY) sweep --config "$$CONFIG" --inventory "$$INV" --budgets "$$BUDGETS" $${TOPK_CAPS:+--topk-caps "$$TOPK_CAPS"} \
		$${HOST:+--host "$$HOST"} $${CLIFF_DROP:+--cliff-drop "$$CLIFF_DROP"} $${TIE_TOLERANCE:+--tie-tolerance "$$TIE_TOLERANCE"} \
		$${BATCHES:+--batches "$$BATCHES"}

lab-up: $(STAMP) ## Boot the lab: LAB_HOSTS systemd-nspawn hosts on 127.0.1.x, inventory/lab.yml
	$(PY) tests/lab/lab.py up

lab-down: $(STAMP) ## Stop the lab hosts and remove their state
	$(PY) tests/lab/lab.py down

lab-status: $(STAMP) ## List the lab hosts
	$(PY) tests/lab/lab.py status

lint: $(STAMP) ## ruff, mypy (sgdeploy/ and the collection's module_utils), yamllint, ansible-lint (production profile)
	$(VENV)/bin/ruff check sgdeploy tests patches/sglang/src collections
	$(VENV)/bin/mypy
	$(VENV)/bin/yamllint -s .
	$(VENV)/bin/ansible-lint --offline -q --profile production playbooks collections/ansible_collections/sgdeploy/host/roles
	@$(MAKE) --no-print-directory sanity

# ansible-test sanity on the collection, from its own root. ansible-test bootstraps pip in each test's virtualenv
# with a get-pip.py it downloads from ci-files.testing.ansible.com, which these machines cannot reach:
# tests/sanity/get_pip_standin.py does the same from the package index. Its virtualenvs live in build/.
# Skipped: pep8 and pylint (ruff, configured in pyproject.toml, is the project's one Python linter; a second
# style would contradict it), changelog (the project keeps no changelog fragments).
ANSIBLE_TEST_HOME := $(CURDIR)/build/ansible-test-home
COLLECTION_ROOT   := collections/ansible_collections/sgdeploy/host
sanity: $(STAMP) ## ansible-test sanity on the collection (validate-modules, import, compile, ansible-doc, ...)
	@mkdir -p $(ANSIBLE_TEST_HOME)/.ansible/test/cache
	@cp tests/sanity/get_pip_standin.py $(ANSIBLE_TEST_HOME)/.ansible/test/cache/get_pip_24_2.py
	cd $(COLLECTION_ROOT) && HOME=$(ANSIBLE_TEST_HOME) $(CURDIR)/$(VENV)/bin/ansible-test sanity --python 3.11 \
	  --color no --skip-test pep8 --skip-test pylint --skip-test changelog

test-unit: $(STAMP) $(PROMTOOL) ## CPU tests (no lab), without the slow ones (under 2 minutes)
	$(PY) -m pytest -p no:cacheprovider -q -m "not slow" tests/unit

promtool: $(PROMTOOL) ## Fetch promtool (Debian's prometheus .deb, sha256-pinned) into build/tools/ for the rule tests

$(PROMTOOL):
	@mkdir -p build/downloads build/tools
	@deb="build/downloads/prometheus_$(PROMETHEUS_DEB_VERSION)_amd64.deb"; \
	 if [ "$$(dpkg --print-architecture)" = amd64 ] && { [ -f "$$deb" ] || { \
	      python3 -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' \
	        "$(PROMETHEUS_DEB_URL)" "$$deb.part" 2>/dev/null && mv "$$deb.part" "$$deb"; }; }; then \
	   if ! echo "$(PROMETHEUS_DEB_SHA256)  $$deb" | sha256sum -c --status; then \
	     echo "$$deb: sha256 is not the pinned $(PROMETHEUS_DEB_SHA256); removed, nothing unpacked" >&2; \
	     rm -f "$$deb"; exit 1; fi; \
	 else \
	   rm -f "$$deb.part"; dir="$$(mktemp -d build/downloads/apt.XXXXXX)"; \
	   ( cd "$$dir" && { apt-get download -qq prometheus 2>/dev/null || \
	     { apt-get update -qq && apt-get download -qq prometheus; }; } ) || \
	     { echo "promtool: neither $(PROMETHEUS_DEB_URL) nor apt-get download prometheus gave the package" >&2; \
	       rm -rf "$$dir"; exit 1; }; \
	   deb="$$(ls "$$dir"/prometheus_*.deb)"; \
	   echo "promtool: the pinned prometheus $(PROMETHEUS_DEB_VERSION) (amd64) is not available; using apt's" \
	        "$$(dpkg-deb -f "$$deb" Version) ($$(dpkg-deb -f "$$deb" Architecture)) - update PROMETHEUS_DEB_* in the Makefile" >&2; \
	 fi; \
	 dpkg-deb --fsys-tarfile "$$deb" | tar -xO ./usr/bin/promtool > "$@.part"; \
	 rm -rf build/downloads/apt.*; chmod 0755 "$@.part"; mv "$@.part" "$@"
	@$@ --version | head -1

test-slow: $(STAMP) ## The slow CPU tests (they build CPU virtualenvs; minutes)
	$(PY) -m pytest -p no:cacheprovider -q -m slow tests/unit

test-lab: $(STAMP) ## Lab integration tests on two labs at once; both taken down, even on failure
	@PY=$(PY) tests/lab/run.sh

test-slow-lab: $(STAMP) ## test-lab with the slow CPU tests as a third stream beside the two labs (what make test runs)
	@PY=$(PY) WITH_SLOW=1 tests/lab/run.sh

test: lint test-unit test-slow-lab ## Everything CI runs: lint, unit tests, then the slow CPU tests beside the lab tests

clean: ## Remove build/ and reports/ (keeps the lab's cached root filesystem)
	rm -rf build/render build/wheels reports

# ---- SGLang patch series (docs/build.md, "Changing the series") ----
.PHONY: patch-work patch-diff

patch-work: $(STAMP) ## Unpack pristine SGLang + patches/sglang/src + the series (up to PATCH=) into build/patchwork/tree
	@$(SGDEPLOY) patchwork work $${PATCH:+--patch "$$PATCH"}

patch-diff: $(STAMP) ## Write build/patchwork/tree's edits back into PATCH=0002-... (its header kept)
	@if [ -z "$$PATCH" ]; then echo "PATCH is required, e.g. make patch-diff PATCH=0002-ddtree-recurrent-state-forking" >&2; exit 2; fi
	@$(SGDEPLOY) patchwork diff --patch "$$PATCH"

# --- the patched server end to end on the H200 (tests/gpu/e2e/README.md) ---
.PHONY: gpu-server-bundle
gpu-server-bundle: $(STAMP) ## Prepare what the H200 end-to-end harness carries into .gpu-e2e/ (wheels, kernels, plans)
	$(PY) tests/gpu/e2e/bundle.py --out .gpu-e2e

.PHONY: reference
reference: $(STAMP) ## Record CONFIG's exactness reference: its target alone on its GPUs, then CONFIG again [HOST= INVENTORY=]
	$(need_config)
	@$(SGDEPLOY) validate "$$CONFIG" >/dev/null
	$(ensure_lab)
	$(need_host_or_limit)
	@mkdir -p build/reference
	@ref="build/reference/reference-$$(basename "$$CONFIG" .yml).yml"; lim=(); \
	 if [ -n "$$HOST" ]; then lim=(--limit "$$HOST"); elif [ -n "$$LIMIT" ]; then lim=(--limit "$$LIMIT"); fi; \
	 $(SGDEPLOY) exactness reference-config "$$CONFIG" --out "$$ref" >/dev/null && \
	 $(ANSIBLE_PLAYBOOK) -i "$$INV" "$${lim[@]}" playbooks/deploy.yml -e config="$$ref" && \
	 $(ANSIBLE_PLAYBOOK) -i "$$INV" "$${lim[@]}" playbooks/deploy.yml -e config="$$CONFIG"

.PHONY: plan
plan: $(STAMP) ## Show what a deploy of CONFIG would change, changing nothing (--check --diff) [INVENTORY= LIMIT= REPLACES=]
	$(need_config)
	@$(SGDEPLOY) validate "$$CONFIG" >/dev/null
	$(ensure_lab)
	$(need_hosts)
	$(ANSIBLE_PLAYBOOK) -i "$$INV" $(LIMIT_ARG) playbooks/deploy.yml --check --diff -e config="$$CONFIG" $(FLEET_ARG) $(REPLACES_ARG)
