// Wrapper module for scripts/gpu-stack-testbin.sh: builds KAI-Scheduler's binaries. The module
// proxy here serves only this exact version (no version list, so `go install ...@v0.12.0` fails),
// hence a module that requires it; `go mod tidy` (run by the script in the cache dir) adds the
// indirect requirements and go.sum. KAI's go.mod has no replace directives, so none are needed.
module example.invalid/fracpilot/kaitestbin

go 1.24.4

require github.com/NVIDIA/KAI-scheduler v0.12.0
