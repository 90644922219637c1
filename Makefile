# sgdeploy: Blackwell hosts → a gated, measured SGLang speculative-decoding service.
# `make help` lists the targets. Every target sets up .venv itself when needed.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

VENV        ?= .venv
PY          := $(VENV)/bin/python
STAMP       := $(VENV)/.installed
CONFIG      ?=
INVENTORY   ?=
LIMIT       ?=
SERIAL      ?= 1
LAB_HOSTS   ?= 2
LAB_INVENTORY ?= inventory/lab.yml
BUDGETS     ?= 8 15 16 32 64
TOPK_CAPS   ?=
CLIFF_DROP  ?=
TIE_TOLERANCE ?=
HOST        ?=
PATCHES     ?=
export LAB_HOSTS LAB_INVENTORY
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

# No INVENTORY: the lab (brought up when absent).
ifeq ($(strip $(INVENTORY)),)
  INV := $(LAB_INVENTORY)
  USE_LAB := 1
else
  INV := $(INVENTORY)
  USE_LAB :=
endif
LIMIT_ARG := $(if $(strip $(LIMIT)),--limit $(LIMIT),)

define need_config
	@if [ -z "$(CONFIG)" ]; then echo "CONFIG is required, e.g. make $@ CONFIG=ddtree-b15 (configs: $$(ls configs | sed 's/\.yml$$//' | tr '\n' ' '))" >&2; exit 2; fi
endef

define ensure_lab
	@if [ -n "$(USE_LAB)" ]; then \
	  echo "No INVENTORY given: using the lab ($(LAB_INVENTORY)), bringing it up if needed."; \
	  $(PY) tests/lab/lab.py up >/dev/null; \
	fi
endef

.PHONY: help setup lint test test-unit test-lab config render validate wheel deploy gate rollback status \
        provision build verify sweep lab-up lab-down lab-status clean

help: ## List the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

$(STAMP): requirements.txt pyproject.toml
	@command -v systemd-analyze >/dev/null || { apt-get update -qq && apt-get install -y -qq systemd >/dev/null; }
	@python3 -c 'import ensurepip' 2>/dev/null || { apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null; }
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -e .
	@touch $@

setup: $(STAMP) ## Create .venv with the pinned Python dependencies (other targets do it for you)

config: $(STAMP) ## Print the fully merged config: make config CONFIG=ddtree-b15
	$(need_config)
	@$(PY) -m sgdeploy config $(CONFIG)

validate: $(STAMP) ## Validate every config in configs/ (or CONFIG=...)
	@$(PY) -m sgdeploy validate $(CONFIG)

render: $(STAMP) ## Render the unit + env file to build/render/<config>/: make render CONFIG=...
	$(need_config)
	@$(PY) -m sgdeploy render $(CONFIG)

wheel: $(STAMP) ## Build the patched SGLang wheel for CONFIG (or PATCHES=ddtree,fork) into build/wheels/
	@if [ -n "$(PATCHES)" ]; then $(PY) -m sgdeploy.wheel --features $(PATCHES); \
	 else $(if $(CONFIG),$(PY) -m sgdeploy.wheel --config $(CONFIG),echo "CONFIG or PATCHES is required" >&2; exit 2); fi

deploy: $(STAMP) ## Deploy CONFIG with gates and automatic rollback [INVENTORY= LIMIT= SERIAL=]
	$(need_config)
	@$(PY) -m sgdeploy validate $(CONFIG) >/dev/null
	$(ensure_lab)
	ansible-playbook -i $(INV) $(LIMIT_ARG) playbooks/deploy.yml -e config=$(CONFIG) -e deploy_serial=$(SERIAL)

gate: $(STAMP) ## Run CONFIG's gates from the controller through an SSH tunnel [HOST= INVENTORY=]
	$(need_config)
	$(ensure_lab)
	@$(PY) -m sgdeploy gate $(CONFIG) --inventory $(INV) $(if $(HOST),--host $(HOST),)

rollback: $(STAMP) ## Go back by hand to the previous deploy of CONFIG [INVENTORY= LIMIT=]
	$(need_config)
	$(ensure_lab)
	ansible-playbook -i $(INV) $(LIMIT_ARG) playbooks/rollback.yml -e config=$(CONFIG)

status: $(STAMP) ## Show what runs where, with the last gate numbers [INVENTORY=]
	$(ensure_lab)
	ansible-playbook -i $(INV) $(LIMIT_ARG) playbooks/status.yml

provision: $(STAMP) ## Provision NVIDIA driver + CUDA [INVENTORY= LIMIT=]
	$(ensure_lab)
	ansible-playbook -i $(INV) $(LIMIT_ARG) playbooks/provision.yml

build: $(STAMP) ## Build the wheel for CONFIG and install the release on the hosts
	$(need_config)
	$(ensure_lab)
	ansible-playbook -i $(INV) $(LIMIT_ARG) playbooks/build.yml -e config=$(CONFIG)

verify: $(STAMP) ## Run the testinfra checks in tests/infra/ against INVENTORY
	$(ensure_lab)
	$(PY) -m pytest -p no:cacheprovider tests/infra --hosts=ansible://gpu_hosts --ansible-inventory=$(INV) $(if $(CONFIG),--config=$(CONFIG),)

sweep: $(STAMP) ## Sweep CONFIG over BUDGETS (and TOPK_CAPS) on one host; report in reports/sweeps/
	$(need_config)
	$(ensure_lab)
	$(PY) -m sgdeploy.sweep --config $(CONFIG) --inventory $(INV) --budgets "$(BUDGETS)" $(if $(TOPK_CAPS),--topk-caps "$(TOPK_CAPS)",) $(if $(HOST),--host $(HOST),) \
		$(if $(CLIFF_DROP),--cliff-drop $(CLIFF_DROP),) $(if $(TIE_TOLERANCE),--tie-tolerance $(TIE_TOLERANCE),)

lab-up: $(STAMP) ## Boot the lab: LAB_HOSTS systemd-nspawn hosts on 127.0.1.x, inventory/lab.yml
	$(PY) tests/lab/lab.py up

lab-down: $(STAMP) ## Stop the lab hosts and remove their state
	$(PY) tests/lab/lab.py down

lab-status: $(STAMP) ## List the lab hosts
	$(PY) tests/lab/lab.py status

lint: $(STAMP) ## ruff, yamllint, ansible-lint (production profile)
	$(VENV)/bin/ruff check sgdeploy tests
	$(VENV)/bin/yamllint -s .
	$(VENV)/bin/ansible-lint --offline -q --profile production playbooks roles

test-unit: $(STAMP) ## CPU tests (no lab)
	$(PY) -m pytest -p no:cacheprovider -q tests/unit

test-lab: $(STAMP) ## Lab integration tests on two labs at once; both taken down, even on failure
	@PY=$(PY) tests/lab/run.sh

test: lint test-unit test-lab ## Everything CI runs: lint, unit tests, lab tests

clean: ## Remove build/ and reports/ (keeps the lab's cached root filesystem)
	rm -rf build/render build/wheels reports

.PHONY: plan
plan: $(STAMP) ## Show what a deploy of CONFIG would change, changing nothing (--check --diff) [INVENTORY= LIMIT=]
	$(need_config)
	$(ensure_lab)
	ansible-playbook -i $(INV) $(LIMIT_ARG) playbooks/deploy.yml --check --diff -e config=$(CONFIG)
