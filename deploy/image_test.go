package deploy

import (
	"bytes"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestDockerfile checks the image's shape: a Go build stage that builds with
// scripts/build-static.sh (the flags CI checks in TestStaticBuild), a final
// stage on distroless/static or scratch running as a non-root user, the
// HTTP port exposed and listened on beyond loopback.
func TestDockerfile(t *testing.T) {
	b, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var froms []string
	var user, expose, httpAddr string
	var buildsWithScript bool
	// Join continuation lines, drop comments.
	text := strings.ReplaceAll(string(b), "\\\n", " ")
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		switch strings.ToUpper(f[0]) {
		case "FROM":
			froms = append(froms, f[1])
		case "RUN":
			if len(froms) == 1 && slices.Contains(f, "scripts/build-static.sh") {
				buildsWithScript = true
			}
		case "USER":
			user = f[1]
		case "EXPOSE":
			expose = f[1]
		case "ENV":
			for _, kv := range f[1:] {
				if v, ok := strings.CutPrefix(kv, "FLASHSALE_HTTP_ADDR="); ok {
					httpAddr = v
				}
			}
		}
	}
	if len(froms) != 2 || !strings.HasPrefix(froms[0], "golang:1.26") {
		t.Errorf("stages %v: want golang:1.26 to build, then the runtime image", froms)
	}
	if len(froms) > 0 {
		if last := froms[len(froms)-1]; last != "scratch" && !strings.HasPrefix(last, "gcr.io/distroless/static") {
			t.Errorf("runtime image %s: want distroless/static or scratch (the binary is static)", last)
		}
	}
	if !buildsWithScript {
		t.Error("the build stage does not run scripts/build-static.sh: the image would not hold the binary CI checks")
	}
	if user == "" || user == "root" || user == "0" || strings.HasPrefix(user, "0:") || strings.HasPrefix(user, "root:") {
		t.Errorf("USER %q: want a non-root user", user)
	}
	if expose != "8080" || httpAddr != "0.0.0.0:8080" {
		t.Errorf("EXPOSE %q, FLASHSALE_HTTP_ADDR %q: want 8080 and 0.0.0.0:8080", expose, httpAddr)
	}
	if _, err := os.Stat("../.dockerignore"); err != nil {
		t.Error(err)
	}
}

// TestStaticBuild builds flashsale as the Dockerfile does
// (scripts/build-static.sh) and checks that the result runs on an image with
// no C library: no ELF interpreter, no shared libraries, symbols stripped;
// then runs it.
func TestStaticBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary with its own flags (a full compile the first time)")
	}
	bin := filepath.Join(t.TempDir(), "flashsale")
	cmd := exec.Command("../scripts/build-static.sh", bin)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("scripts/build-static.sh: %v\n%s", err, out)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the binary has an ELF interpreter (PT_INTERP): it is dynamically linked and will not start on distroless/static or scratch")
		}
	}
	if libs, err := f.ImportedLibraries(); err != nil || len(libs) > 0 {
		t.Errorf("shared libraries %v (%v), want none", libs, err)
	}
	if f.Section(".symtab") != nil {
		t.Error("the binary keeps its symbol table: -ldflags -s was lost")
	}

	// A version subcommand may not exist yet; help lists the subcommands.
	var out bytes.Buffer
	run := exec.Command(bin, "help")
	run.Stdout, run.Stderr = &out, &out
	run.Env = []string{} // no FLASHSALE_* from the test's environment
	if err := run.Run(); err != nil {
		t.Logf("flashsale help: %v", err)
	}
	if !strings.Contains(out.String(), "serve") {
		t.Errorf("flashsale help printed %q, want the subcommands", out.String())
	}
}
