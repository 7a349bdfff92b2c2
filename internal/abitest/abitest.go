// Package abitest compares the layout of Go structs with their C
// counterparts, as gcc lays them out from the system headers.
//
// It is used by the layout tests of the generated ABI packages
// (internal/uverbs, internal/mlx4abi): each test lists its structs as Cases,
// and Check compiles one C program that prints the size of every struct and
// the offset and size of every member, then compares them with what
// reflect reports for the Go types.
package abitest

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// Case pairs a Go struct type with a C struct.
type Case struct {
	C  string       // C type, e.g. "struct ib_uverbs_cmd_hdr"
	Go reflect.Type // the Go struct
	// Fields pairs C member designators with Go field paths. A C designator
	// may name a nested member ("core.response"); so may a Go path
	// ("Core.Response").
	Fields [][2]string
}

// Check compiles a C program from includes (a C preamble of #include and
// declaration lines) that reports every size and offset named by cases, and
// fails t for each difference with Go. It skips t when gcc or a header is
// missing.
func Check(t *testing.T, includes string, cases []Case) {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc not found: the layout test needs gcc and the linux-libc-dev headers")
	}
	for line := range strings.SplitSeq(includes, "\n") {
		h, ok := strings.CutPrefix(strings.TrimSpace(line), "#include <")
		if !ok {
			continue
		}
		h = strings.TrimSuffix(h, ">")
		if _, err := os.Stat(filepath.Join("/usr/include", h)); err != nil {
			t.Skipf("header <%s> not found (install linux-libc-dev): %v", h, err)
		}
	}

	var c bytes.Buffer
	c.WriteString("#include <stdio.h>\n#include <stddef.h>\n")
	c.WriteString(includes)
	c.WriteString("\nint main(void) {\n")
	for i, k := range cases {
		fmt.Fprintf(&c, "\tprintf(\"S %d %%zu\\n\", sizeof(%s));\n", i, k.C)
		for j, f := range k.Fields {
			fmt.Fprintf(&c, "\tprintf(\"F %d %d %%zu %%zu\\n\", offsetof(%s, %s), sizeof(((%s *)0)->%s));\n",
				i, j, k.C, f[0], k.C, f[0])
		}
	}
	c.WriteString("\treturn 0;\n}\n")

	dir := t.TempDir()
	src := filepath.Join(dir, "layout.c")
	bin := filepath.Join(dir, "layout")
	if err := os.WriteFile(src, c.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(gcc, "-Wall", "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("compile layout program: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatalf("run layout program: %v", err)
	}

	seen := make([]bool, len(cases))
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		w := strings.Fields(sc.Text())
		n := make([]int, len(w)-1)
		for i := range n {
			if n[i], err = strconv.Atoi(w[i+1]); err != nil {
				t.Fatalf("bad line %q", sc.Text())
			}
		}
		switch k := cases[n[0]]; w[0] {
		case "S":
			seen[n[0]] = true
			if got := int(k.Go.Size()); got != n[1] {
				t.Errorf("%s: sizeof = %d, Go %s has size %d", k.C, n[1], k.Go, got)
			}
		case "F":
			f := k.Fields[n[1]]
			off, size, err := fieldLayout(k.Go, f[1])
			if err != nil {
				t.Errorf("%s.%s: %v", k.C, f[0], err)
				continue
			}
			if off != n[2] || size != n[3] {
				t.Errorf("%s.%s: offset %d size %d, Go %s.%s has offset %d size %d",
					k.C, f[0], n[2], n[3], k.Go, f[1], off, size)
			}
		}
	}
	for i, k := range cases {
		if !seen[i] {
			t.Errorf("%s: no size reported", k.C)
		}
		checkCovered(t, k)
	}
}

// fieldLayout resolves a dotted Go field path to its offset and size.
func fieldLayout(t reflect.Type, path string) (off, size int, err error) {
	for name := range strings.SplitSeq(path, ".") {
		f, ok := t.FieldByName(name)
		if !ok {
			return 0, 0, fmt.Errorf("go type %s has no field %s", t, name)
		}
		off += int(f.Offset)
		t = f.Type
	}
	return off, int(t.Size()), nil
}

// checkCovered fails when a named top-level Go field is not compared with C:
// a field added by hand would otherwise go unchecked.
func checkCovered(t *testing.T, k Case) {
	t.Helper()
	top := map[string]bool{}
	for _, f := range k.Fields {
		name, _, _ := strings.Cut(f[1], ".")
		top[name] = true
	}
	for i := range k.Go.NumField() {
		if f := k.Go.Field(i); f.Name != "_" && !top[f.Name] {
			t.Errorf("%s: Go field %s.%s has no C counterpart in the layout table", k.C, k.Go, f.Name)
		}
	}
}
