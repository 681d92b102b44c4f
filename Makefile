# KafScale developer commands. `make run` and `make test` are the two set-up commands.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
APT_PACKAGES := kcat etcd-server strace golang-go golang-github-shopify-sarama-dev golang-github-segmentio-kafka-go-dev chromium chromium-driver
# Stream processing libraries the tests run apps of, each in a venv of its own built from
# the pyproject extra of its name (.venv-NAME from extra NAME): Quix Streams
# (tests/test_quix_streams.py) pins confluent-kafka < 2.13 and pydantic < 2.14, older than
# the test venv's clients; Faust (tests/test_faust.py) brings its own aiokafka/aiohttp stack.
APP_VENVS := .venv-quix .venv-faust
APP_STAMPS := $(APP_VENVS:%=%/.installed)

.PHONY: install run test bench system-deps clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[s3,etcd,pipeline,test]'
	touch $(STAMP)

install: $(STAMP)

.venv-%/.installed: pyproject.toml $(STAMP)
	$(PYTHON) -m venv .venv-$*
	@# unquoted: one word per requirement (word splitting only, no redirection or globbing here)
	.venv-$*/bin/pip install -q $$($(BIN)/python -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["$*"])')
	touch $@

run: install
	$(BIN)/kafscale broker --listen 127.0.0.1:9092 --advertise 127.0.0.1:9092 --data-dir ./data

# Debian packages the integration tests use (kcat, etcd, strace for the fsyncs traced in
# tests/test_durability_syscalls.py, Go with sarama and kafka-go for tests/test_go_clients.py,
# Chromium and its driver for the console's browser tests in tests/test_console.py);
# installed only when missing.
system-deps:
	@missing=""; \
	command -v kcat >/dev/null || missing="$$missing kcat"; \
	command -v etcd >/dev/null || missing="$$missing etcd-server"; \
	command -v strace >/dev/null || missing="$$missing strace"; \
	command -v java >/dev/null || missing="$$missing openjdk-17-jre-headless"; \
	command -v go >/dev/null || missing="$$missing golang-go"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v chromedriver >/dev/null || missing="$$missing chromium-driver"; \
	[ -d /usr/share/gocode/src/github.com/Shopify/sarama ] || missing="$$missing golang-github-shopify-sarama-dev"; \
	[ -d /usr/share/gocode/src/github.com/segmentio/kafka-go ] || missing="$$missing golang-github-segmentio-kafka-go-dev"; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

test: install system-deps $(APP_STAMPS)
	@# pytest exit code 5 (nothing collected) is not a failure of the suite
	$(BIN)/python -m pytest -q -ra $(PYTEST_ARGS); rc=$$?; if [ $$rc -eq 5 ]; then exit 0; fi; exit $$rc

bench: install system-deps
	$(BIN)/pip install -q -e '.[bench]'  # Tansu (the peer), matplotlib, py-spy
	$(BIN)/python bench/run.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) $(APP_VENVS) data
