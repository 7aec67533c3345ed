# agent-wrap. `make test` runs every test; `make demo` builds and runs a real job.
SHELL := /bin/bash
GO ?= go
PKG := github.com/agent-wrap/agent-wrap
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
LDFLAGS := -s -w -X $(PKG)/cli.version=$(VERSION) -X $(PKG)/cli.commit=$(COMMIT) -X $(PKG)/mcpserver.version=$(VERSION)
BIN := bin/agent-wrap
# The MCP server `agent-wrap mcp` execs, a program of its own so that
# agent-wrap does not carry the MCP SDK (mcpserver/doc.go).
MCPBIN := bin/agent-wrap-mcp

export CGO_ENABLED := 0

.PHONY: build test race deps lint demo bench dist cross crossvet package clean

# What the tests need besides Go: installed as root with apt-get, else named.
deps:
	@.ci/deps

build:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/agent-wrap
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(MCPBIN) ./cmd/agent-wrap-mcp

# The five systems agent-wrap is built for: the host side is Linux only; the
# controller (ssh, ledger, settle) runs on all five (docs/controller.md).
PLATFORMS := linux/amd64 linux/arm64 darwin/amd64 darwin/arm64 freebsd/amd64

# agent-wrap-mcp runs where an agent runs a controller, so it is built for
# MCP_PLATFORMS, every controller platform by default; deploy sends hosts
# agent-wrap alone. The deploy tests need only agent-wrap's builds and pass
# MCP_PLATFORMS= (five links fewer).
MCP_PLATFORMS ?= $(PLATFORMS)

# Static release builds: dist/agent-wrap-OS-ARCH for each platform,
# dist/agent-wrap-mcp-OS-ARCH for each of MCP_PLATFORMS, and
# dist/SHA256SUMS (`agent-wrap deploy` sends the linux agent-wrap ones) and
# the licence, dist/LICENSE.
# DISTDIR=DIR builds elsewhere (the deploy tests do).
dist:
	@d='$(or $(DISTDIR),dist)'; set -e; mkdir -p "$$d"; names=; \
	for p in $(PLATFORMS); do os=$${p%/*}; arch=$${p#*/}; names="$$names agent-wrap-$$os-$$arch"; \
		echo "+ GOOS=$$os GOARCH=$$arch $(GO) build -o $$d/agent-wrap-$$os-$$arch"; \
		CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -trimpath -ldflags '$(LDFLAGS)' \
			-o "$$d/agent-wrap-$$os-$$arch" ./cmd/agent-wrap; \
	done; \
	for p in $(MCP_PLATFORMS); do os=$${p%/*}; arch=$${p#*/}; names="$$names agent-wrap-mcp-$$os-$$arch"; \
		echo "+ GOOS=$$os GOARCH=$$arch $(GO) build -o $$d/agent-wrap-mcp-$$os-$$arch"; \
		CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -trimpath -ldflags '$(LDFLAGS)' \
			-o "$$d/agent-wrap-mcp-$$os-$$arch" ./cmd/agent-wrap-mcp; \
	done; \
	cp LICENSE "$$d/LICENSE"; \
	cd "$$d" && sha256sum $$names >SHA256SUMS && cat SHA256SUMS

# The host side as packages: DISTDIR (dist/) gets agent-wrap_V_ARCH.deb and
# agent-wrap-V-1.ARCH.rpm for amd64 and arm64. `go run ./cmd/packaging` stages
# the files (the binary and agent-wrap-mcp beside it, the man page and completions from the command
# table, the watchdog's units from deploy/units, the copyright file) and
# writes nfpm's configuration; nfpm, pinned in go.mod as a tool, packs them.
# MAINTAINER defaults to the last commit's author. The LICENSE file at the
# top of the tree is shipped as the licence, LICENSE_ID its SPDX name.
MAINTAINER ?= $(shell git log -1 --format='%an <%ae>' 2>/dev/null)
LICENSE_ID ?= Apache-2.0
package:
	@d='$(or $(DISTDIR),dist)'; set -e; mkdir -p "$$d"; \
	lic=; [ -f LICENSE ] && lic="-license-file $$PWD/LICENSE -license $(LICENSE_ID)"; \
	for arch in amd64 arm64; do \
		s=$$(mktemp -d); trap 'rm -rf "$$s"' EXIT; \
		echo "+ GOOS=linux GOARCH=$$arch $(GO) build -o $$s/agent-wrap"; \
		CGO_ENABLED=0 GOOS=linux GOARCH=$$arch $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o "$$s/agent-wrap" ./cmd/agent-wrap; \
		CGO_ENABLED=0 GOOS=linux GOARCH=$$arch $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o "$$s/agent-wrap-mcp" ./cmd/agent-wrap-mcp; \
		echo "+ $(GO) run ./cmd/packaging -arch $$arch -version $(VERSION)"; \
		$(GO) run -ldflags '$(LDFLAGS)' ./cmd/packaging -bin "$$s/agent-wrap" -mcp-bin "$$s/agent-wrap-mcp" -arch $$arch -version '$(VERSION)' \
			-maintainer '$(MAINTAINER)' $$lic -out "$$s/stage"; \
		for p in deb rpm; do $(GO) tool nfpm package -f "$$s/stage/nfpm.yaml" -p $$p -t "$$d"; done; \
		rm -rf "$$s"; \
	done

# Fast portability check, no emulator: agent-wrap builds for every platform,
# and on each one that is not Linux, go vet (test files too) passes on every
# package of this module the build links. A Linux-only import or call in a
# package the controller needs fails here the day it is written.
cross:
	@set -e; for p in $(PLATFORMS); do os=$${p%/*}; arch=$${p#*/}; \
		echo "+ GOOS=$$os GOARCH=$$arch $(GO) build ./cmd/agent-wrap"; \
		GOOS=$$os GOARCH=$$arch $(GO) build -o /dev/null ./cmd/agent-wrap; \
	done
	@$(MAKE) --no-print-directory crossvet

# The vet half of cross. make test runs this half only: deploy's tests build
# every platform with make dist and check each binary's format, so linking
# five binaries again here (most of cross's half a minute) proves nothing more.
crossvet:
	@set -e; for p in $(PLATFORMS); do os=$${p%/*}; arch=$${p#*/}; \
		[ $$os = linux ] && continue; \
		pkgs=$$(GOOS=$$os GOARCH=$$arch $(GO) list -deps ./cmd/agent-wrap | grep '^$(PKG)/'); \
		echo "+ GOOS=$$os GOARCH=$$arch $(GO) vet" $$(echo $$pkgs | sed 's|$(PKG)/|./|g'); \
		GOOS=$$os GOARCH=$$arch $(GO) vet $$pkgs; \
	done

# Every test: unit, process-tree, CLI scripts and the end-to-end SSH tests,
# then make race (about half a minute more). .ci/deps installs what they
# need (as root, with apt-get) or stops, naming it; under CI=true a skipped
# test fails the run. .ci/leftovers fails the run if a process the tests
# started outlives them, naming it and its package.
# TEST_P: test binaries run at once. Most tests wait on leases, graces and
# processes rather than the CPU (a run of the suite uses about 1.2 of 2
# cores with go test's default of one per core), so 4 at once end sooner.
TEST_P ?= 4
test: deps build crossvet
	$(GO) vet ./...
	@if [ "$$CI" = true ]; then set -x; .ci/leftovers .ci/noskip $(GO) test -p $(TEST_P) -count=1 -timeout 15m ./...; \
	else set -x; .ci/leftovers $(GO) test -p $(TEST_P) -count=1 -timeout 15m ./...; fi
	@$(MAKE) --no-print-directory race

# The race detector over the packages that run goroutines of their own or
# share state between them (the controller's streams, renewals and mux, the
# wrapper's followers and gateways, the ledgers, the run directory's locks
# and watcher, the watchdog's side-by-side stops). It needs cgo (a C
# compiler: .ci/deps installs gcc). Tests that count allocations are built
# only without it (//go:build !race): the detector allocates on its own.
RACE_PKGS := ./agentrelay ./controller ./handoff ./httpgw ./internal/relay ./ledger ./proc ./rundir ./watchdog ./wrapper
race: deps
	@if [ "$$CI" = true ]; then set -x; CGO_ENABLED=1 .ci/leftovers .ci/noskip $(GO) test -race -count=1 -timeout 20m $(RACE_PKGS); \
	else set -x; CGO_ENABLED=1 .ci/leftovers $(GO) test -race -count=1 -timeout 20m $(RACE_PKGS); fi

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt: $$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...

# Build, then run a real job: a shell with a background child, streamed back,
# then its record and verdict.
demo: build
	@root=$$(mktemp -d); trap 'rm -rf "$$root"' EXIT; \
	id=demo-$$$$; \
	echo "+ $(BIN) --root $$root $$id -- sh -c 'echo hello from \$$\$$; sleep 1 & echo child started; wait; echo done'"; \
	$(BIN) --root "$$root" $$id -- sh -c 'echo hello from $$$$; sleep 1 & echo child started; wait; echo done'; \
	echo "exit: $$?"; \
	$(BIN) --root "$$root" status $$id; \
	$(BIN) --root "$$root" show $$id; \
	$(BIN) --root "$$root" verify $$id

# Measure agent-wrap against bare baselines, interleaved in one run, and write
# BENCHMARKS.md (about 5 minutes; BENCH_QUICK=1 for a 1-minute pass).
bench: build
	$(GO) build -o bin/awbench ./bench/cmd/awbench
	$(GO) build -trimpath -o bin/awfloor ./bench/cmd/awfloor
	$(GO) build -trimpath -ldflags '-s -w' -o bin/idlefloor ./bench/cmd/idlefloor
	bin/awbench -bin $(BIN) -out BENCHMARKS.md -command '$(if $(BENCH_QUICK),BENCH_QUICK=1 )make bench'

clean:
	rm -rf bin dist

.PHONY: soak fuzz chaos

# The seeded fault campaign (chaos/README.md): schedules of runs and faults
# drawn from a seed, played as root against the real binary on a tmpfs,
# with invariants checked all the time, until DURATION (default 20m) or a
# violation; then the coverage of fault × phase. SEED=n replays seed n
# alone (with DURATION too: a campaign from seed n on).
SEED ?=
DURATION ?=
chaos: deps build
	$(GO) build -o bin/awchaos ./chaos/cmd/awchaos
	bin/awchaos -bin $(BIN) $(if $(SEED),-seed $(SEED) $(if $(DURATION),-duration $(DURATION),-count 1),-duration $(or $(DURATION),20m))

# Reliability at full counts (soak/README.md): the wrapper SIGKILLed at 200
# random moments, 300 concurrent runs from 4 clients, hostile layouts, a full
# disk, secrets in the environment. About 10 minutes; `go test` runs the same
# tests at small counts. AGENT_WRAP_SOAK_SEED=N replays a crash sequence.
soak: build
	AGENT_WRAP_SOAK=1 $(GO) test -count=1 -timeout 60m -v ./soak/

# A short fuzz run of each parser of input agent-wrap did not write itself
# (FUZZTIME each, 10s by default; a count such as 50000x bounds it by inputs
# instead, as CI does: a time bound can fail with "context deadline exceeded"
# and no failing input on Go 1.26 under load), from the seed corpora checked in under each
# package's testdata/fuzz; a failing input is written there to be checked in.
FUZZTIME ?= 10s
FUZZ_TARGETS := statusfile:FuzzStatusParse lease:FuzzParseDeadline \
	journal:FuzzParseLine journal:FuzzVerify journal:FuzzVerifyTamper \
	rundir:FuzzValidID proc:FuzzParseStat proc:FuzzParseStatRoundTrip
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do p=$${t%%:*}; f=$${t##*:}; \
		echo "+ $(GO) test ./$$p -run '^$$f\$$' -fuzz '^$$f\$$' -fuzztime $(FUZZTIME)"; \
		$(GO) test ./$$p -run "^$$f\$$" -fuzz "^$$f\$$" -fuzztime $(FUZZTIME); \
	done
