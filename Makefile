# Sandcell. `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

# The machine's own Go has standard-library vulnerabilities; go.mod's toolchain line
# is ignored here, so the toolchain is pinned for every go command this file runs.
export GOTOOLCHAIN := go1.27.3
export CGO_ENABLED := 1

VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
LDFLAGS  := -X main.version=$(VERSION) -X main.revision=$(REVISION)
BIN      := bin/sandcell
BUNDLE   := build/bundle
export SANDCELL_BUNDLE_DIR := $(CURDIR)/$(BUNDLE)
export SANDCELL_CACHE_DIR  := $(CURDIR)/build/cache

.PHONY: help prereqs build interpreter interpreter-verify native native-verify bundle demo mcp-client runsc py-deps ts-client e2b-client clients test test-short bench fuzz soak chaos limits check clean stage deb rpm lint-packages test-packages image-root image test-image

# Packages: the version comes from `git describe` (a v* tag), else 0.1.0 with the
# commit count and hash; SOURCE_DATE_EPOCH (the last commit's time) dates everything.
NFPM_VERSION      := v2.45.2
STATICCHECK_VERSION := v0.8.2
# The packages whose tests need no bundle, run again under the race detector.
RACE_PACKAGES := ./healthz ./sandbox/protocol ./sandbox/policy ./supervisor/runs ./supervisor/sessions \
  ./supervisor/approvals ./supervisor/config \
  ./supervisor/store ./supervisor/workspace ./supervisor/wire
NFPM              := build/tools/nfpm
PKG_ARCH          := $(shell go env GOARCH 2>/dev/null || echo amd64)
PKG_VERSION       ?= $(shell v=$$(git describe --tags --match 'v[0-9]*' 2>/dev/null) && echo "$${v\#v}" | tr - + || echo "0.1.0~git$$(git rev-list --count HEAD 2>/dev/null || echo 0).$$(git rev-parse --short=8 HEAD 2>/dev/null || echo unknown)")
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
export PKG_ARCH PKG_VERSION SOURCE_DATE_EPOCH
DEB := dist/sandcell_$(PKG_VERSION)_$(PKG_ARCH).deb
RPM := dist/sandcell_$(PKG_VERSION)_$(PKG_ARCH).rpm

help: ## List the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

# The Debian packages the build needs (the interpreter is built in a debootstrapped
# root; libseccomp compiles the seccomp filter, through cgo). As root they are
# installed when missing; as another user the one apt-get line is printed.
BUILD_DEPS := debootstrap:debootstrap curl:curl xz:xz-utils pkg-config:pkg-config gcc:gcc
prereqs: ## Install the Debian packages the build needs, if any is missing (as root)
	@need=""; for d in $(BUILD_DEPS); do command -v $${d%%:*} >/dev/null || need="$$need $${d#*:}"; done; \
	  pkg-config --exists libseccomp 2>/dev/null || need="$$need libseccomp-dev"; \
	  [ -z "$$need" ] && exit 0; \
	  if [ "$$(id -u)" != 0 ]; then echo "the build needs:$$need; run: sudo apt-get install -y$$need" >&2; exit 1; fi; \
	  echo "installing:$$need"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$need

# The lean worker (cmd/sandcell-worker) is built just before each binary that carries
# it, with the same flags, into LEAN_WORKER, which cmd/appliance embeds under the
# leanworker tag (workers then run none of the daemon's package initialisers; see
# sandbox.UseWorkerBinary). A binary built without the tag re-executes itself.
LEAN_WORKER := cmd/appliance/sandcell-worker

build: prereqs ## Build bin/sandcell (version stamped, carrying the lean worker)
	go build -trimpath -ldflags '$(LDFLAGS)' -o $(LEAN_WORKER) ./cmd/sandcell-worker
	go build -trimpath -tags leanworker -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/appliance

# Static, so it runs in the trixie build root whatever the host's glibc. (The linker's
# warnings about getpwuid_r/getaddrinfo/dlopen in static binaries concern code that
# wasirun never calls, so they are filtered out.)
build/wasirun: prereqs FORCE
	set -o pipefail; go build -trimpath -ldflags '-linkmode external -extldflags -static' -o $@ ./bundle/interpreter/wasirun 2>&1 | \
	  { grep -vE 'statically linked applications|^/usr/bin/ld: .*in function|^# github.com/sandcell/sandcell/bundle/interpreter/wasirun$$' || true; }

interpreter: build/wasirun ## Build CPython for WASI from pinned Debian sources (cached; first time ~15 min, root)
	bundle/interpreter/build.sh build/wasirun build/interpreter

interpreter-verify: build build/wasirun ## Rebuild the interpreter in a fresh root and check the bytes equal the pinned ones
	rm -rf build/interpreter-verify
	bundle/interpreter/build.sh build/wasirun build/interpreter-verify --fresh
	d=$$(mktemp -d) && trap 'rm -rf "$$d"' EXIT && $(BIN) bundle install --dir "$$d" build/interpreter-verify && \
	  $(BIN) bundle verify --dir "$$d" --all=false --snapshot
	@echo "interpreter-verify: a fresh build reproduced the pinned python.wasm, python313.zip and site.zip, and its snapshot is reproducible"

# The native backend's root file system: Debian trixie's python3 and data stack from
# the packages bundle/native/recipe.sh pins by SHA-256, unpacked without maintainer
# scripts, byte-compiled and normalised (see bundle/native/README.md).
native: ## Build the native backend's root from pinned Debian trixie packages (cached; first time a few minutes, root)
	bundle/native/build.sh build/native

native-verify: native ## Rebuild the native root in a fresh directory and check its MANIFEST equals the cached build's
	rm -rf build/native-verify
	bundle/native/build.sh build/native-verify --fresh
	cmp build/native/MANIFEST build/native-verify/MANIFEST
	@echo "native-verify: a fresh build reproduced the native root byte for byte (MANIFEST $$(sha256sum build/native/MANIFEST | cut -c1-16))"

# The native root goes into the bundle as native/ (rootfs and MANIFEST), replaced whole
# (by one rename) when its MANIFEST differs from the built one's.
bundle: build interpreter native ## Install the verified interpreter and the native root into build/bundle and precompile its .cwasm files
	$(BIN) bundle verify --native never >/dev/null 2>&1 || { \
	  $(BIN) bundle install build/interpreter && $(BIN) bundle precompile; }
	cmp -s build/native/MANIFEST $(BUNDLE)/native/MANIFEST || { \
	  rm -rf $(BUNDLE)/native.tmp $(BUNDLE)/native && mkdir -p $(BUNDLE)/native.tmp && \
	  cp -a build/native/rootfs build/native/MANIFEST $(BUNDLE)/native.tmp/ && mv $(BUNDLE)/native.tmp $(BUNDLE)/native; }
	$(BIN) bundle verify --native required

demo: bundle ## Run the sample programs in the sandbox: the wasm backend's, then the native backend's (pandas, a figure)
	@ws=$$(mktemp -d) && trap 'rm -rf "$$ws"' EXIT && \
	  echo "$$ $(BIN) run --workspace $$ws examples/demo.py" && \
	  $(BIN) run --workspace "$$ws" examples/demo.py && \
	  echo "on the host, $$ws/hello.txt says: $$(cat "$$ws/hello.txt")" && echo && \
	  echo "$$ $(BIN) run --backend native --workspace $$ws examples/native-demo.py" && \
	  $(BIN) run --backend native --workspace "$$ws" examples/native-demo.py && \
	  echo "on the host, the figure is $$(ls "$$ws"/displays/*.png)"

# The official TypeScript MCP SDK for cmd/appliance's client test, at the versions
# test/mcp-client/package-lock.json pins (npm ci); Node.js and npm from Debian.
mcp-client: test/mcp-client/node_modules/.package-lock.json ## Install the TypeScript MCP client the tests use (npm ci)
test/mcp-client/node_modules/.package-lock.json: test/mcp-client/package-lock.json
	@need=""; command -v node >/dev/null || need="$$need nodejs"; command -v npm >/dev/null || need="$$need npm"; \
	  if [ -n "$$need" ]; then \
	    if [ "$$(id -u)" != 0 ]; then echo "the tests need:$$need; run: sudo apt-get install -y$$need" >&2; exit 1; fi; \
	    echo "installing:$$need"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$need; fi
	cd test/mcp-client && npm ci --no-audit --no-fund --loglevel=error
	touch $@

# gVisor's runsc from Debian, for the native backend's gvisor layer and its tests.
runsc: ## Install runsc (gVisor), which the gvisor layer's tests use
	@if ! command -v runsc >/dev/null; then \
	  if [ "$$(id -u)" != 0 ]; then echo "the tests need runsc; run: sudo apt-get install -y runsc" >&2; exit 1; fi; \
	  echo "installing: runsc"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq runsc; fi

# The Python client (clients/python): built and tested with Debian's python3 and
# these packages from Debian's archive (never pip), installed when missing.
PYTHON    := /usr/bin/python3
PY_DEPS   := python3-httpx python3-pytest python3-pytest-asyncio python3-build python3-setuptools python3-wheel
py-deps: ## Install the Debian packages the Python client's build and tests use
	@need=""; for p in $(PY_DEPS); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || need="$$need $$p"; done; \
	  if [ -n "$$need" ]; then \
	    if [ "$$(id -u)" != 0 ]; then echo "the Python client needs:$$need; run: sudo apt-get install -y$$need" >&2; exit 1; fi; \
	    echo "installing:$$need"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$need; fi

# The TypeScript client (clients/typescript) and the agent frameworks' providers
# (clients/providers): one npm workspace (clients/package.json), its build and test
# dependencies (TypeScript, Node's types, the AI SDK, Deep Agents and LangChain) at
# the versions clients/package-lock.json pins (npm ci).
ts-client: clients/node_modules/.package-lock.json ## Install the TypeScript client's and providers' dependencies (npm ci)
clients/node_modules/.package-lock.json: clients/package-lock.json
	cd clients && npm ci --no-audit --no-fund --loglevel=error
	touch $@

# E2B's own SDKs (e2b, @e2b/code-interpreter) for the E2B-compatible endpoint's test,
# at the versions test/e2b-client/package-lock.json pins.
e2b-client: test/e2b-client/node_modules/.package-lock.json ## Install E2B's SDK the tests use (npm ci)
test/e2b-client/node_modules/.package-lock.json: test/e2b-client/package-lock.json
	cd test/e2b-client && npm ci --no-audit --no-fund --loglevel=error
	touch $@

clients: py-deps ts-client ## Build the client packages into dist/clients: the Python wheel and sdist, the npm tarballs (client and providers)
	$(PYTHON) -m build --no-isolation --outdir dist/clients clients/python
	cd clients && for w in typescript providers/ai-sdk providers/deepagents; do npm run build --silent -w $$w || exit 1; done
	cd clients && npm pack --silent --workspaces --pack-destination ../dist/clients

test: bundle mcp-client runsc py-deps ts-client e2b-client ## Run every test with the real interpreter and real workers, then the sandbox suite again through warm workers
	go test -count=1 -timeout 45m ./...
	SANDCELL_TEST_WARM=1 go test -count=1 -timeout 30m ./sandbox

test-short: bundle mcp-client py-deps ts-client e2b-client ## Run the tests that take seconds, not minutes
	go test -short -count=1 ./...

bench: bundle mcp-client ## Benchmarks: interpreter vs native (and npm, with SANDCELL_NPM_WASM), epoch vs fuel, cold runs by hardening layer, then bench/: API, CLI, native python3 and bwrap side by side, the guest's speed against CPython 3.13 (root)
	go test -run '^$$' -bench . -benchtime 10x -count 1 ./sandbox/engine
	go test -run '^$$' -bench 'BenchmarkColdRun|BenchmarkWarmRun|BenchmarkSession|BenchmarkNativeSession' -benchtime 20x -count 1 ./sandbox
	go run ./bench -sandcell $(BIN)

# Go's native fuzzing of every decoder of untrusted input, each target for FUZZTIME
# (one target per go test: -fuzz takes one). Seeds are in the tests and in each
# package's testdata/fuzz; an input that fails is written there, and so becomes a
# regression test of every `go test`. It prints each target's executions.
FUZZTIME ?= 1m
FUZZ_TARGETS := FuzzDecode:./supervisor/api FuzzLoadTokens:./supervisor/api FuzzLoad:./supervisor/config \
  FuzzLookup:./supervisor/workspace FuzzReceive:./sandbox/protocol FuzzReadCheckpointHeader:./sandbox \
  FuzzParse:./sandbox/engine/wasmimage FuzzToolArguments:./supervisor/mcpserver FuzzReadToolFrame:./sandbox/protocol
fuzz: ## Fuzz every decoder of untrusted input, FUZZTIME each (default 1m; CI: 10s)
	@out=$$(mktemp) && trap 'rm -f "$$out"' EXIT && for t in $(FUZZ_TARGETS); do \
	  name=$${t%%:*} pkg=$${t#*:}; \
	  if ! go test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) $$pkg >"$$out" 2>&1; then \
	    cat "$$out"; echo "fuzz: $$name failed (the input is in $$pkg/testdata/fuzz/$$name)"; exit 1; fi; \
	  printf '%-26s %-28s %s\n' "$$name" "$$pkg" "$$(grep -o 'elapsed: [^,]*, execs: [0-9]*' "$$out" | tail -1)"; \
	done

# A real daemon under a mixed load at concurrency 8 for SOAKTIME (default 10m; CI: 2m),
# then its checks: every answer as planned, no unplanned 5xx, the audit log equal to
# what the callers saw, no worker outliving its run by a second, the daemon's RSS and
# descriptors within 10% (see bench/soak).
SOAKTIME ?= 10m
soak: bundle ## Soak a real daemon under mixed load for SOAKTIME (default 10m; CI: 2m) and check what it kept
	go run ./bench/soak -sandcell $(BIN) -duration $(SOAKTIME)

# Faults injected into a real daemon under load: CHAOS_KILLS SIGKILLs (default 20; CI:
# 5), the state file system full, the audit database locked by another process, floods
# of slow connections and of runs (see bench/chaos; the full file system and the other
# uid's run need root, and are skipped otherwise, saying so).
CHAOS_KILLS ?= 20
chaos: bundle ## Kill the daemon under load, fill its disk, lock its audit log, flood it; check what holds
	go run ./bench/chaos -sandcell $(BIN) -kills $(CHAOS_KILLS)

# How exactly each limit is kept: LIMIT_TRIALS runs of each (default 100; CI: 20) of
# the wall clock, CPU, a sleep, a catastrophic regex and a huge integer's formatting
# (p99 within the limit and 250 ms), memory and output (see bench/limits).
LIMIT_TRIALS ?= 100
limits: bundle ## Measure how exactly each limit is kept, LIMIT_TRIALS runs each (default 100; CI: 20)
	go run ./bench/limits -sandcell $(BIN) -trials $(LIMIT_TRIALS)

check: ## vet, staticcheck, gofmt, go mod tidy, import rules and package docs, the race detector on the packages that need no bundle
	go vet ./...
	go run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }
	go mod tidy -diff
	go test -count=1 -run 'TestImportRules|TestOneProblemWriter|TestAuditKindsFromTheCatalog|TestPackageDocs|TestNoExportedVariables' .
	go test -race -short -count=1 $(RACE_PACKAGES)

$(NFPM):
	GOBIN=$(CURDIR)/build/tools go install github.com/goreleaser/nfpm/v2/cmd/nfpm@$(NFPM_VERSION)

stage: bundle ## Stage the package contents in dist/stage (PIE binary, its precompiled bundle, man pages, completions)
	rm -rf dist/stage && mkdir -p dist/stage/completions dist/stage/man dist/stage/licenses
	go build -trimpath -buildmode=pie -ldflags '$(LDFLAGS) -s -w -linkmode external -extldflags "-Wl,-z,relro,-z,now"' \
	  -o $(LEAN_WORKER) ./cmd/sandcell-worker
	go build -trimpath -tags leanworker -buildmode=pie -ldflags '$(LDFLAGS) -s -w -linkmode external -extldflags "-Wl,-z,relro,-z,now"' \
	  -o dist/stage/sandcell ./cmd/appliance
	dist/stage/sandcell bundle install --dir dist/stage/bundle build/interpreter
	dist/stage/sandcell bundle precompile --dir dist/stage/bundle
	SANDCELL_BUNDLE_DIR=/usr/lib/sandcell SANDCELL_CACHE_DIR=/var/cache/sandcell dist/stage/sandcell manpage dist/stage/man
	gzip -9n dist/stage/man/*.8
	dist/stage/sandcell completion bash > dist/stage/completions/sandcell.bash
	dist/stage/sandcell completion zsh > dist/stage/completions/_sandcell
	dist/stage/sandcell completion fish > dist/stage/completions/sandcell.fish
	cp packaging/copyright dist/stage/copyright
	cp LICENSE dist/stage/licenses/sandcell
	cp "$$(go env GOROOT)/LICENSE" dist/stage/licenses/go
	cp "$$(go list -m -f '{{.Dir}}' github.com/bytecodealliance/wasmtime-go/v44)/LICENSE" dist/stage/licenses/wasmtime
	chmod 0644 dist/stage/licenses/*
	{ printf 'sandcell ($(PKG_VERSION)-1) unstable; urgency=medium\n\n  * Built from revision $(REVISION).\n\n'; \
	  printf ' -- Sandcell developers <sandcell@example.org>  %s\n' "$$(date -u -R -d @$(SOURCE_DATE_EPOCH))"; } \
	  | gzip -9n > dist/stage/changelog.Debian.gz
	cp dist/stage/changelog.Debian.gz dist/stage/changelog.gz

deb: stage $(NFPM) ## Build dist/sandcell_VERSION_ARCH.deb
	rm -f dist/*.deb
	$(NFPM) package --config nfpm.yaml --packager deb --target $(DEB)

rpm: stage $(NFPM) ## Build dist/sandcell_VERSION_ARCH.rpm
	rm -f dist/*.rpm
	$(NFPM) package --config nfpm.yaml --packager rpm --target $(RPM)

lint-packages: deb rpm ## shellcheck on the maintainer scripts, lintian and rpmlint on the packages (overrides carry their reasons)
	shellcheck packaging/test-image.sh && shellcheck -s sh packaging/deb/postinst packaging/deb/prerm packaging/deb/postrm packaging/rpm/post packaging/rpm/preun packaging/rpm/postun packaging/test-packages.sh packaging/test-boot.sh packaging/test-inside.sh
	lintian --fail-on error,warning $(DEB)
	rpmlint --config packaging/rpm/rpmlint.toml $(RPM)

test-packages: lint-packages ## Lint the packages, check the rpm in a scratch root and the deb's hardening, then the deb under a booted systemd
	packaging/test-packages.sh $(DEB) $(RPM)
	mkdir -p dist/upgrade && rm -f dist/upgrade/*.deb
	PKG_VERSION=$(PKG_VERSION).1 $(NFPM) package --config nfpm.yaml --packager deb --target dist/upgrade/sandcell_$(PKG_VERSION).1_$(PKG_ARCH).deb
	packaging/test-boot.sh $(DEB) dist/upgrade/sandcell_$(PKG_VERSION).1_$(PKG_ARCH).deb

# The OCI image. podman runs with the project's own configuration (packaging/podman:
# runc, cgroupfs, file events; vfs storage under build/podman), never the machine's.
IMAGE_TAG   := $(shell echo '$(PKG_VERSION)' | tr '~+' '--')
IMAGE       := localhost/sandcell:$(IMAGE_TAG)
IMAGE_TAR   := dist/sandcell-image.tar
IMAGE_ROOT  := dist/image/rootfs
PODMAN_DIR  := $(CURDIR)/build/podman
export CONTAINERS_CONF := $(CURDIR)/packaging/podman/containers.conf
export CONTAINERS_STORAGE_CONF := $(PODMAN_DIR)/storage.conf
export IMAGE IMAGE_TAR REVISION

$(PODMAN_DIR)/storage.conf:
	mkdir -p $(PODMAN_DIR)
	printf '[storage]\ndriver = "vfs"\ngraphroot = "%s/storage"\nrunroot = "%s/run"\n' $(PODMAN_DIR) $(PODMAN_DIR) > $@

# The image's files, owned by root (the state directories by uid 65532, set by the
# Containerfile). The binary is static (glibc and libseccomp linked in, with Go's own
# user and DNS code: -tags osusergo,netgo), so the image needs no shared libraries;
# the linker's warnings name glibc functions only wasmtime code we never call uses.
# The bundle ships the epochless engine's .cwasm, the one runs use, zstd-compressed
# (unpacked into the state volume at start); the plain one (sessions) and the
# fuel-metered one are compiled there on first start (each another 9 MB compressed
# would take the archive past its 150 MB bound).
image-root: bundle ## Stage the image's files in dist/image (static binary, bundle, licences, /etc)
	rm -rf dist/image
	mkdir -p $(IMAGE_ROOT)/usr/bin $(IMAGE_ROOT)/etc/sandcell $(IMAGE_ROOT)/usr/share/licenses/sandcell dist/image/state
	set -o pipefail; for p in sandcell-worker:$(LEAN_WORKER) appliance:$(IMAGE_ROOT)/usr/bin/sandcell; do \
	  go build -trimpath -tags osusergo,netgo,leanworker -ldflags '$(LDFLAGS) -s -w -linkmode external -extldflags -static' \
	    -o $${p#*:} ./cmd/$${p%%:*} 2>&1 | \
	    { grep -vE 'statically linked applications|^/usr/bin/ld: .*in function|^# github.com/sandcell/sandcell/cmd/[a-z-]+$$' || true; }; done
	$(IMAGE_ROOT)/usr/bin/sandcell bundle install --dir $(IMAGE_ROOT)/usr/lib/sandcell build/interpreter
	$(IMAGE_ROOT)/usr/bin/sandcell bundle precompile --dir $(IMAGE_ROOT)/usr/lib/sandcell --variant epochless
	zstd -19 -T0 -q --rm $(IMAGE_ROOT)/usr/lib/sandcell/python-*.cwasm
	$(IMAGE_ROOT)/usr/bin/sandcell bundle verify --dir $(IMAGE_ROOT)/usr/lib/sandcell --all=false
	install -m 0644 packaging/image/passwd packaging/image/group $(IMAGE_ROOT)/etc/
	install -m 0644 packaging/image/sandcell.toml $(IMAGE_ROOT)/etc/sandcell/sandcell.toml
	$(IMAGE_ROOT)/usr/bin/sandcell config validate $(IMAGE_ROOT)/etc/sandcell/sandcell.toml
	cd $(IMAGE_ROOT)/usr/share/licenses/sandcell && \
	  cp $(CURDIR)/LICENSE sandcell && cp $(CURDIR)/packaging/copyright copyright && \
	  cp "$$(go env GOROOT)/LICENSE" go && \
	  cp "$$(go list -m -f '{{.Dir}}' github.com/bytecodealliance/wasmtime-go/v44)/LICENSE" wasmtime && \
	  cp /usr/share/doc/libc6/copyright glibc && cp /usr/share/doc/libseccomp2/copyright libseccomp && \
	  dpkg-query -W -f='$${Package} $${Version} (Debian source package $${source:Package} $${source:Version}), linked statically into /usr/bin/sandcell\n' \
	    libc6-dev libseccomp-dev > STATIC-LIBRARIES
	chmod -R u=rwX,go=rX $(IMAGE_ROOT)
	install -d -m 1777 $(IMAGE_ROOT)/tmp
	find dist/image -exec touch -h -d @$(SOURCE_DATE_EPOCH) {} +

image: image-root $(PODMAN_DIR)/storage.conf ## Build the OCI image (FROM scratch) with podman and write dist/sandcell-image.tar (docker format)
	podman build --format docker --timestamp $(SOURCE_DATE_EPOCH) -f Containerfile -t $(IMAGE) -t localhost/sandcell:latest \
	  --build-arg VERSION=$(PKG_VERSION) --build-arg REVISION=$(REVISION) \
	  --build-arg CREATED=$$(date -u -d @$(SOURCE_DATE_EPOCH) +%Y-%m-%dT%H:%M:%SZ) dist/image
	rm -f $(IMAGE_TAR)
	podman save --format docker-archive -o $(IMAGE_TAR) $(IMAGE)
	podman image prune -f >/dev/null
	@echo "$(IMAGE_TAR): $$(du -m --apparent-size $(IMAGE_TAR) | cut -f1) MiB ($(IMAGE))"

test-image: image ## Load dist/sandcell-image.tar into podman and test it read-only, without capabilities (root)
	packaging/test-image.sh $(IMAGE_TAR) $(IMAGE)

clean: ## Remove build outputs (the interpreter build cache in /var/cache/sandcell-build stays)
	rm -rf bin build dist

FORCE:
