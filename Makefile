# Two entry points: `make serve` and `make test`. Both set up everything on a fresh machine first.
# `make test` is the full suite (CI runs it); `make test-quick` only the tests that start no JVM (no Spark, no Java client).
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
ARGS   ?=

.PHONY: serve test setup lint docs bench clean test-quick

serve: setup
	$(VENV)/bin/icelog serve $(ARGS)

# Two xdist workers: the Spark tests (one group, tests/conftest.py) on one, the JVM-free tests on the other.
test: setup
	$(VENV)/bin/pytest -n 3 --dist loadgroup $(ARGS)

# ICELOG_TESTS_NO_JVM: a test that starts a JVM without the `spark` or `java` marker fails here (tests/conftest.py).
test-quick: setup
	ICELOG_TESTS_NO_JVM=1 $(VENV)/bin/pytest -n 3 -m 'not spark and not java' $(ARGS)

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py src/icelog/records/_records.c src/icelog/schema/codec/_avro_columns.c src/icelog/schema/codec/_proto_columns.c src/icelog/schema/codec/_json_columns.c src/icelog/_c/utf8.h src/icelog/_c/column_buffers.h scripts/setup.sh \
		jars/pom.xml jars/kafka/pom.xml scripts/fetch-jars.sh tests/go/go.mod tests/go/go.sum tests/js/package-lock.json
	scripts/setup.sh
	touch $(STAMP)

lint: setup
	$(VENV)/bin/ruff check src tests bench scripts
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# The manual (docs/, mkdocs.yml) as a site in site/; --strict: a link that points nowhere fails the build.
docs: setup
	$(VENV)/bin/mkdocs build --strict

bench: setup
	$(PY) bench/broker_bench.py

clean:
	rm -rf $(VENV) icelog-data site
