package store

import (
	"os"
	"regexp"
	"testing"
)

// The catalog in Kind's doc comment lists exactly the kinds of Kinds, once each.
func TestCatalogDocumented(t *testing.T) {
	src, err := os.ReadFile("kinds.go")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]int{}
	for _, m := range regexp.MustCompile(`(?m)^//\t([a-z]+\.[a-z_]+) `).FindAllStringSubmatch(string(src), -1) {
		documented[m[1]]++
	}
	seen := map[Kind]bool{}
	for _, k := range Kinds() {
		if seen[k] {
			t.Errorf("%s twice in Kinds", k)
		}
		seen[k] = true
		if documented[string(k)] != 1 {
			t.Errorf("%s is in the catalog %d times", k, documented[string(k)])
		}
	}
	if len(documented) != len(seen) {
		t.Errorf("the catalog has %d kinds, Kinds %d", len(documented), len(seen))
	}
}
