package main

import (
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"
)

// TestSweepTempDirs: a sweep removes the directories of xrcrun of this
// host whose lock nobody holds, and leaves those whose maker lives, those
// with no lock file (being made, older, or on a filesystem without
// flock), those a node agent holds, those of other hosts and those of
// other programs.
func TestSweepTempDirs(t *testing.T) {
	root := t.TempDir()
	mk := func(name string) string {
		dir := filepath.Join(root, name)
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o600)
		return dir
	}
	live := mk("xrcrun-live")
	lock, err := lockDir(live)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	dead := mk("xrcrun-dead")
	l, err := lockDir(dead)
	if err != nil {
		t.Fatal(err)
	}
	l.Close() // as the kernel does when its maker dies
	// A launcher's, its maker gone, still used by a node agent.
	held := mk("xrcrun-held")
	if l, err = lockDir(held); err != nil {
		t.Fatal(err)
	}
	release, err := holdTempDir(held)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	l.Close()
	mk("xrcrun-nolock")
	// Another host's, on a TMPDIR the hosts share: its lock is that
	// host's, free here even while its maker lives.
	elsewhere := mk("xrcrun-elsewhere")
	if err := os.WriteFile(filepath.Join(elsewhere, lockName), []byte(hostname()+".other"), 0o600); err != nil {
		t.Fatal(err)
	}
	other := mk("other-dead")
	if l, err = lockDir(other); err != nil {
		t.Fatal(err)
	}
	l.Close()

	var removed []string
	sweepTempDirs(root, func(dir string) { removed = append(removed, filepath.Base(dir)) })
	if !slices.Equal(removed, []string{"xrcrun-dead"}) {
		t.Fatalf("removed %q, want only xrcrun-dead", removed)
	}
	for _, name := range []string{"xrcrun-live", "xrcrun-held", "xrcrun-nolock", "xrcrun-elsewhere", "other-dead"} {
		if _, err := os.Stat(filepath.Join(root, name, "f")); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := os.Stat(dead); !os.IsNotExist(err) {
		t.Errorf("xrcrun-dead is still there: %v", err)
	}
}

// TestKilledLauncherDirs: a launcher killed with SIGKILL leaves its
// runtime directory behind; the next xrcrun removes it.
func TestKilledLauncherDirs(t *testing.T) {
	t.Parallel()
	tmp := t.TempDir()
	j := startJob(t, "../..", []string{"TMPDIR=" + tmp}, "-n", "1", "sleep", "60")
	var left []string
	for deadline := time.Now().Add(time.Minute); len(left) == 0; time.Sleep(10 * time.Millisecond) {
		left, _ = filepath.Glob(filepath.Join(tmp, tempPrefix+"*", lockName))
		if time.Now().After(deadline) {
			t.Fatal("the job made no runtime directory in TMPDIR")
		}
	}
	j.cmd.Process.Signal(syscall.SIGKILL)
	j.wait(time.Minute) // and its rank is gone: the agent's Pdeathsig
	for _, l := range left {
		if _, err := os.Stat(l); err != nil {
			t.Fatalf("the killed launcher's directory went: %v", err)
		}
	}
	if st := startJob(t, "../..", []string{"TMPDIR=" + tmp}, "-n", "1", "true").wait(time.Minute); st != 0 {
		t.Fatalf("xrcrun -n 1 true: exit status %d", st)
	}
	if ents, _ := os.ReadDir(tmp); len(ents) != 0 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Fatalf("left in TMPDIR: %q", names)
	}
}
