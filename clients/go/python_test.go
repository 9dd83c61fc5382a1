package kvindex_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestPythonClient runs clients/python's unittest suite with the system
// python3 against this package's indexer and fake engine, so that `make test`
// covers the Python client too.
func TestPythonClient(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("python3 is needed to test clients/python: %v", err)
	}
	dir, err := filepath.Abs(filepath.Join("..", "python"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(python, "-m", "unittest", "-v", "test_kvindex_client")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"KVINDEX_URL="+exampleHTTP, "KVINDEX_ENGINE_URL="+engineURL,
		"KVINDEX_MODEL="+exampleModel, "KVINDEX_ADMIN_TOKEN="+exampleToken,
		"PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python3 -m unittest: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}
