// Command mkabi generates Go definitions of kernel ABI structs from C headers.
//
// It runs `go tool cgo -godefs` on a types file (a `//go:build ignore` Go file
// that names each C struct and constant to export, as golang.org/x/sys does),
// then post-processes the result:
//
//   - fields get idiomatic Go names derived from their C names, which are read
//     from the DWARF of a small C object compiled with gcc (cgo strips common
//     field prefixes, so its names cannot be mapped back reliably);
//   - cgo padding fields become `_`, and every struct starts with
//     `_ structs.HostLayout`;
//   - references to C struct types are replaced by the Go names of the types
//     file.
//
// It writes the Go file and a companion test file listing, for every struct,
// its C name and the C name of every Go field, which the package's layout test
// uses to compare sizes and offsets with what gcc computes.
//
// Usage (from a //go:generate line):
//
//	go tool mkabi -types types_linux.go -out zabi_linux.go -layout zlayout_test.go
package main

import (
	"bytes"
	"debug/dwarf"
	"debug/elf"
	"errors"
	"flag"
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "mkabi:", err)
		os.Exit(1)
	}
}

// cstruct is one struct exported by the types file.
type cstruct struct {
	goName string
	cName  string   // without the "struct " keyword
	fields []string // C member names in declaration order
}

func run(args []string) error {
	fs := flag.NewFlagSet("mkabi", flag.ContinueOnError)
	types := fs.String("types", "types_linux.go", "types file (Go with import \"C\")")
	out := fs.String("out", "zabi_linux.go", "generated Go file")
	layout := fs.String("layout", "zlayout_test.go", "generated layout table for the layout test")
	incdir := fs.String("I", "/usr/include", "C include directory")
	if err := fs.Parse(args); err != nil {
		return err
	}
	src, err := os.ReadFile(*types)
	if err != nil {
		return err
	}
	structs, preamble, err := readTypes(src)
	if err != nil {
		return fmt.Errorf("read %s: %w", *types, err)
	}
	if err := cFieldNames(structs, preamble, *incdir); err != nil {
		return fmt.Errorf("read C field names: %w", err)
	}
	cmd := exec.Command("go", "tool", "cgo", "-godefs", "--", "-I"+*incdir, filepath.Base(*types))
	cmd.Dir = filepath.Dir(*types)
	cmd.Stderr = os.Stderr
	godefs, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("cgo -godefs: %w", err)
	}
	gen, err := rewrite(godefs, structs, *types)
	if err != nil {
		return err
	}
	if err := os.WriteFile(*out, gen, 0o644); err != nil {
		return err
	}
	tab, err := layoutTable(structs, preamble, *types)
	if err != nil {
		return err
	}
	return os.WriteFile(*layout, tab, 0o644)
}

// readTypes lists the `type X C.struct_y` declarations of the types file and
// returns its cgo preamble (the #include lines).
func readTypes(src []byte) ([]*cstruct, string, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "types.go", src, parser.ParseComments)
	if err != nil {
		return nil, "", err
	}
	var preamble string
	var out []*cstruct
	for _, d := range f.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok {
			continue
		}
		if gd.Tok == token.IMPORT && gd.Doc != nil {
			preamble = gd.Doc.Text()
		}
		if gd.Tok != token.TYPE {
			continue
		}
		for _, s := range gd.Specs {
			ts := s.(*ast.TypeSpec)
			sel, ok := ts.Type.(*ast.SelectorExpr)
			if !ok {
				continue
			}
			if x, ok := sel.X.(*ast.Ident); !ok || x.Name != "C" || !strings.HasPrefix(sel.Sel.Name, "struct_") {
				continue
			}
			out = append(out, &cstruct{goName: ts.Name.Name, cName: strings.TrimPrefix(sel.Sel.Name, "struct_")})
		}
	}
	if preamble == "" {
		return nil, "", errors.New("no cgo preamble")
	}
	return out, preamble, nil
}

// cFieldNames compiles a C file using every struct with debug information and
// reads each struct's member names from DWARF.
func cFieldNames(structs []*cstruct, preamble, incdir string) error {
	dir, err := os.MkdirTemp("", "mkabi")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var c bytes.Buffer
	c.WriteString(preamble)
	for i, s := range structs {
		fmt.Fprintf(&c, "struct %s mkabi_v%d;\n", s.cName, i)
	}
	cfile := filepath.Join(dir, "t.c")
	ofile := filepath.Join(dir, "t.o")
	if err := os.WriteFile(cfile, c.Bytes(), 0o644); err != nil {
		return err
	}
	cmd := exec.Command("gcc", "-g", "-c", "-I"+incdir, "-o", ofile, cfile)
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("gcc: %w", err)
	}
	ef, err := elf.Open(ofile)
	if err != nil {
		return err
	}
	defer ef.Close()
	dw, err := ef.DWARF()
	if err != nil {
		return err
	}
	members := map[string][]string{}
	r := dw.Reader()
	for {
		e, err := r.Next()
		if err != nil {
			return err
		}
		if e == nil {
			break
		}
		if e.Tag != dwarf.TagStructType {
			continue
		}
		name, _ := e.Val(dwarf.AttrName).(string)
		if name == "" || !e.Children {
			r.SkipChildren()
			continue
		}
		var names []string
		for {
			m, err := r.Next()
			if err != nil {
				return err
			}
			if m == nil || m.Tag == 0 {
				break
			}
			if m.Tag == dwarf.TagMember {
				n, _ := m.Val(dwarf.AttrName).(string)
				if n == "" {
					return fmt.Errorf("struct %s has an anonymous member; export its parts instead", name)
				}
				flex, err := isFlexibleArray(dw, m)
				if err != nil {
					return err
				}
				if !flex { // cgo drops flexible array members, and so do we
					names = append(names, n)
				}
			}
			if m.Children {
				r.SkipChildren()
			}
		}
		members[name] = names
	}
	for _, s := range structs {
		names, ok := members[s.cName]
		if !ok {
			return fmt.Errorf("struct %s not found in DWARF", s.cName)
		}
		s.fields = names
	}
	return nil
}

// isFlexibleArray reports whether a struct member is a trailing array without
// elements, like driver_data[] or driver_data[0].
func isFlexibleArray(dw *dwarf.Data, m *dwarf.Entry) (bool, error) {
	off, ok := m.Val(dwarf.AttrType).(dwarf.Offset)
	if !ok {
		return false, nil
	}
	t, err := dw.Type(off)
	if err != nil {
		return false, err
	}
	for {
		td, ok := t.(*dwarf.TypedefType)
		if !ok {
			break
		}
		t = td.Type
	}
	at, ok := t.(*dwarf.ArrayType)
	return ok && at.Count <= 0, nil
}

var padRE = regexp.MustCompile(`^Pad_cgo_\d+$`)

// rewrite renames the fields of cgo's output, marks padding and layout, and
// formats the file.
func rewrite(godefs []byte, structs []*cstruct, typesFile string) ([]byte, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "godefs.go", godefs, parser.ParseComments)
	if err != nil {
		return nil, fmt.Errorf("parse cgo output: %w", err)
	}
	byGo := map[string]*cstruct{}
	byC := map[string]string{}
	for _, s := range structs {
		byGo[s.goName] = s
		byC["_Ctype_struct_"+s.cName] = s.goName
	}
	var unknown []string
	ast.Inspect(f, func(n ast.Node) bool {
		if id, ok := n.(*ast.Ident); ok && strings.HasPrefix(id.Name, "_Ctype_") {
			if g, ok := byC[id.Name]; ok {
				id.Name = g
			} else {
				unknown = append(unknown, id.Name)
			}
		}
		return true
	})
	if len(unknown) > 0 {
		slices.Sort(unknown)
		return nil, fmt.Errorf("C types without a Go name in the types file: %v", slices.Compact(unknown))
	}
	for _, d := range f.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok || gd.Tok != token.TYPE {
			continue
		}
		for _, sp := range gd.Specs {
			ts := sp.(*ast.TypeSpec)
			st, ok := ts.Type.(*ast.StructType)
			if !ok {
				continue
			}
			cs := byGo[ts.Name.Name]
			if cs == nil {
				return nil, fmt.Errorf("struct %s not declared in the types file", ts.Name.Name)
			}
			i := 0
			for _, fld := range st.Fields.List {
				for _, name := range fld.Names {
					if padRE.MatchString(name.Name) || name.Name == "_" {
						name.Name = "_"
						continue
					}
					if i >= len(cs.fields) {
						return nil, fmt.Errorf("%s: more Go fields than C members", cs.cName)
					}
					name.Name = GoName(cs.fields[i])
					i++
				}
			}
			if i != len(cs.fields) {
				return nil, fmt.Errorf("%s: %d Go fields for %d C members", cs.cName, i, len(cs.fields))
			}
			host := &ast.Field{
				Names: []*ast.Ident{ast.NewIdent("_")},
				Type:  &ast.SelectorExpr{X: ast.NewIdent("structs"), Sel: ast.NewIdent("HostLayout")},
			}
			st.Fields.List = append([]*ast.Field{host}, st.Fields.List...)
		}
	}
	var body bytes.Buffer
	for _, d := range f.Decls {
		if err := format.Node(&body, fset, d); err != nil {
			return nil, err
		}
		body.WriteString("\n\n")
	}
	var out bytes.Buffer
	out.WriteString(header(typesFile))
	fmt.Fprintf(&out, "//go:build linux\n\npackage %s\n\nimport \"structs\"\n\n", f.Name.Name)
	out.Write(body.Bytes())
	return format.Source(out.Bytes())
}

// layoutTable writes the test-side table that pairs each Go struct and field
// with its C counterpart.
func layoutTable(structs []*cstruct, preamble, typesFile string) ([]byte, error) {
	pkg, err := packageName(typesFile)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.WriteString(header(typesFile))
	fmt.Fprintf(&b, "//go:build linux\n\npackage %s\n\nimport (\n\t\"reflect\"\n\n\t\"github.com/xrcrun/xrc/internal/abitest\"\n)\n\n", pkg)
	fmt.Fprintf(&b, "// layoutIncludes is the C preamble the generated structs came from.\nconst layoutIncludes = %q\n\n", preamble)
	b.WriteString("// generatedLayouts pairs every generated struct and field with its C name.\nvar generatedLayouts = []abitest.Case{\n")
	for _, s := range structs {
		fmt.Fprintf(&b, "\t{C: %q, Go: reflect.TypeFor[%s](), Fields: [][2]string{", "struct "+s.cName, s.goName)
		for _, f := range s.fields {
			fmt.Fprintf(&b, "{%q, %q}, ", f, GoName(f))
		}
		b.WriteString("}},\n")
	}
	b.WriteString("}\n")
	return format.Source(b.Bytes())
}

// header is the first line of a generated file: what made it and how to make
// it again.
func header(typesFile string) string {
	dir := "."
	if abs, err := filepath.Abs(filepath.Dir(typesFile)); err == nil {
		for root := abs; root != filepath.Dir(root); root = filepath.Dir(root) {
			if _, err := os.Stat(filepath.Join(root, "go.mod")); err == nil {
				if rel, err := filepath.Rel(root, abs); err == nil {
					dir = "./" + filepath.ToSlash(rel)
				}
				break
			}
		}
	}
	return fmt.Sprintf("// Code generated by mkabi from %s; run \"go generate %s\" to regenerate. DO NOT EDIT.\n\n",
		filepath.Base(typesFile), dir)
}

func packageName(file string) (string, error) {
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.PackageClauseOnly)
	if err != nil {
		return "", err
	}
	return f.Name.Name, nil
}

// initialisms are C name parts written in capitals in Go names.
var initialisms = map[string]bool{
	"ah": true, "cq": true, "cqe": true, "cqn": true, "db": true, "dgid": true, "dlid": true,
	"fd": true, "gid": true, "guid": true, "hca": true, "id": true, "lid": true, "mr": true,
	"mtu": true, "mw": true, "pd": true, "pdn": true, "psn": true, "qp": true, "qpn": true,
	"rq": true, "sge": true, "sl": true, "slid": true, "sq": true, "srq": true,
	"srqn": true, "tso": true, "va": true, "vl": true, "wc": true, "wq": true, "wr": true,
	"xrcd": true, "uar": true, "bf": true, "rss": true, "sqd": true, "rnr": true, "sgid": true,
}

// GoName turns a C member name such as max_send_wr into MaxSendWR.
func GoName(c string) string {
	var b strings.Builder
	for part := range strings.SplitSeq(c, "_") {
		if part == "" {
			continue
		}
		if initialisms[part] {
			b.WriteString(strings.ToUpper(part))
			continue
		}
		b.WriteString(strings.ToUpper(part[:1]) + part[1:])
	}
	return b.String()
}
