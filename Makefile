# kvindex — see README.md. Every target that compiles first makes sure the system
# packages cgo needs (libzmq3-dev, pkg-config) are present.
GO      ?= go
BIN     := bin
# Packages whose tests exercise goroutines, sockets or shared state run under -race.
# internal/kube is left out: client-go rebuilt with -race costs minutes on 2 cores.
RACE_PKGS ?= ./api/... $(filter-out %/internal/kube,$(shell $(GO) list ./internal/...)) ./bench/... ./cmd/... ./clients/go/...
# Kubernetes discovery, chart rendering and the dashboard/alert checks: heavy
# imports (client-go, helm), run without -race.
DEPLOY_PKGS ?= ./internal/kube ./deploy/...
TEST_TIMEOUT ?= 15m

export CGO_ENABLED := 1

.PHONY: all deps build test test-long test-images bench bench-route bench-route-live lint proto demo fmt clean

all: build

deps:
	@./scripts/deps.sh

build: deps
	$(GO) build -o $(BIN)/ ./cmd/...

test: deps
	./scripts/fetch-tokenizers.sh
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) $(RACE_PKGS)
	$(GO) test -count=1 -timeout $(TEST_TIMEOUT) $(DEPLOY_PKGS)

# Long soak and fault runs (minutes each); not part of `make test`.
test-long: deps
	KVINDEX_LONG=1 $(GO) test -race -timeout 60m -run 'Long|Soak' $(RACE_PKGS)

# The images' runtime stages replayed in a Debian bookworm chroot (root; fetches
# Debian packages; the debootstrap is cached under .cache/). Not part of `make test`.
test-images: deps
	./scripts/image-smoke.sh

bench: deps
	$(GO) test -run '^$$' -bench . -benchmem -timeout 30m ./internal/... ./bench/...

# Route bench (bench/routebench, results in bench/RESULTS.md): every policy on every
# trace, offline (virtual clock), with a request-rate sweep; then the live fleet.
ROUTEBENCH_ARGS ?=
bench-route: build
	$(BIN)/routebench --offline --trace chat,shared-system,document,agentic,burst,unique --workers 8 \
	  --requests 2000 --rate 20 --rates 5,10,40 --out bench/out/route-offline $(ROUTEBENCH_ARGS)

bench-route-live: build
	$(BIN)/routebench --trace chat,agentic,unique --workers 8 --requests 400 --rate 10 --time-scale 0.5 \
	  --policies round-robin,least-loaded,session,prefix-hash,dynamo-approx,kv-aware-no-overlay,kv-aware \
	  --out bench/out/route-live $(ROUTEBENCH_ARGS)

lint: deps
	$(GO) vet ./...
	@command -v buf >/dev/null 2>&1 || $(GO) install github.com/bufbuild/buf/cmd/buf@v1.75.0
	PATH="$$PATH:$$($(GO) env GOPATH)/bin" buf lint

# Regenerates the Go code in api/proto from the .proto files with local plugins (no buf registry needed).
proto:
	$(GO) install github.com/bufbuild/buf/cmd/buf@v1.75.0
	$(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
	$(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
	PATH="$$PATH:$$($(GO) env GOPATH)/bin" buf generate

demo: build
	@./scripts/demo.sh

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf $(BIN)
