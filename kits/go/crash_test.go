package kit

import (
	"reflect"
	"testing"
)

func TestCrashSpecParsed(t *testing.T) {
	got, err := parseCrashSpec(" after_commit:3, after_optimistic_insert ,")
	if err != nil || !reflect.DeepEqual(got, map[string]int{"after_commit": 3, "after_optimistic_insert": 1}) {
		t.Fatalf("got %v, %v", got, err)
	}
	for _, bad := range []string{"after_commit:x", "after_commit:0"} {
		if _, err := parseCrashSpec(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if hook, err := CrashAt(""); hook != nil || err != nil {
		t.Errorf("an empty spec gave a hook")
	}
}

func TestCrashHookKillsAtTheChosenPass(t *testing.T) {
	var killed []int
	hook := crashHook(map[string]int{"after_commit": 2}, func(point string, hit int) { killed = append(killed, hit) })
	for range 3 {
		hook("after_commit")
		hook("after_optimistic_insert")
	}
	if !reflect.DeepEqual(killed, []int{2}) {
		t.Errorf("killed at %v, want the second pass", killed)
	}
}
