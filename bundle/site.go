package bundle

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// siteRoots are the directories, within LibDir, that the site layer's files are
// in: every name in site.zip begins with one of them.
var siteRoots = []string{SitePackagesDir, ZoneDir}

// siteFiles lists site.zip's files by name (slash-separated, relative to LibDir).
// A name outside siteRoots, not clean, or a zip entry that is not a stored regular
// file is an error (wrapping ErrMismatch): the pinned zip has none.
func siteFiles(site []byte) (map[string]*zip.File, error) {
	zr, err := zip.NewReader(bytes.NewReader(site), int64(len(site)))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrMismatch, Pinned().Site.Name, err)
	}
	files := make(map[string]*zip.File, len(zr.File))
	for _, f := range zr.File {
		name := strings.TrimPrefix(f.Name, "./")
		within := false
		for _, r := range siteRoots {
			within = within || strings.HasPrefix(name, r+"/")
		}
		if !within || path.Clean(name) != name || !f.Mode().IsRegular() || files[name] != nil {
			return nil, fmt.Errorf("%w: %s holds %q, not a file of the site layer", ErrMismatch, Pinned().Site.Name, f.Name)
		}
		files[name] = f
	}
	return files, nil
}

// unpackSite writes the site layer site (site.zip's bytes, verified) into lib,
// replacing each of siteRoots whole: the files are written into a new directory
// beside them and checked against Pinned's SiteTree, then each root takes its old
// one's place (a crash in between can leave one root old and one new, or one
// missing, which Verify reports until Install runs again). What a crashed Install
// left in lib is removed first.
func unpackSite(site []byte, lib string) error {
	files, err := siteFiles(site)
	if err != nil {
		return err
	}
	if old, _ := filepath.Glob(filepath.Join(lib, ".site-*")); len(old) > 0 {
		for _, p := range old {
			if err := os.RemoveAll(p); err != nil {
				return fmt.Errorf("bundle: %w", err)
			}
		}
	}
	tmp, err := os.MkdirTemp(lib, ".site-")
	if err != nil {
		return fmt.Errorf("bundle: unpack the site layer: %w", err)
	}
	defer os.RemoveAll(tmp)
	for name, f := range files {
		p := filepath.Join(tmp, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return fmt.Errorf("bundle: unpack the site layer: %w", err)
		}
		if err := writeEntry(f, p); err != nil {
			return fmt.Errorf("bundle: unpack %s: %w", name, err)
		}
	}
	// The zip's bytes are pinned, and so is what they unpack to.
	if sum, err := siteDigest(tmp); err != nil {
		return err
	} else if sum != Pinned().SiteTree {
		return fmt.Errorf("%w: %s unpacks to digest %s, expected %s", ErrMismatch, Pinned().Site.Name, sum, Pinned().SiteTree)
	}
	for _, r := range siteRoots {
		dst := filepath.Join(lib, filepath.FromSlash(r))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return fmt.Errorf("bundle: unpack the site layer: %w", err)
		}
		if err := os.RemoveAll(dst); err != nil {
			return fmt.Errorf("bundle: replace %s: %w", r, err)
		}
		if err := os.Rename(filepath.Join(tmp, filepath.FromSlash(r)), dst); err != nil {
			return fmt.Errorf("bundle: replace %s: %w", r, err)
		}
	}
	return nil
}

func writeEntry(f *zip.File, p string) error {
	r, err := f.Open()
	if err != nil {
		return err
	}
	defer r.Close()
	out, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, r)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

// siteDigest is the digest of the site layer unpacked in lib: the SHA-256 of the list
// of its directories ("NAME/") and files ("NAME SIZE SHA256", hex), sorted, one line
// each; Verify compares it with Pinned's SiteTree. A link or any other file that is
// neither regular nor a directory, or one its group or others may write, is an error
// wrapping ErrMismatch; a layer not unpacked one wrapping fs.ErrNotExist.
func siteDigest(lib string) (string, error) {
	var lines []string
	for _, r := range siteRoots {
		root := filepath.Join(lib, filepath.FromSlash(r))
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(lib, p)
			name := filepath.ToSlash(rel)
			if !d.IsDir() && !d.Type().IsRegular() {
				return fmt.Errorf("%w: the site layer's %s is not a regular file", ErrMismatch, name)
			}
			if fi, err := d.Info(); err != nil {
				return fmt.Errorf("bundle: %w", err)
			} else if fi.Mode().Perm()&0o022 != 0 {
				return fmt.Errorf("%w: the site layer's %s is writable by its group or others", ErrMismatch, name)
			}
			if d.IsDir() {
				lines = append(lines, name+"/\n")
				return nil
			}
			f, err := os.Open(p)
			if err != nil {
				return fmt.Errorf("bundle: %w", err)
			}
			defer f.Close()
			h := sha256.New()
			n, err := io.Copy(h, f)
			if err != nil {
				return fmt.Errorf("bundle: read %s: %w", p, err)
			}
			lines = append(lines, fmt.Sprintf("%s %d %x\n", name, n, h.Sum(nil)))
			return nil
		})
		if err != nil {
			return "", err
		}
	}
	sort.Strings(lines)
	h := sha256.New()
	for _, l := range lines {
		h.Write([]byte(l))
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// libEntries are the only entries of the library directory (LibDir) and of its
// python3.13: anything else there would be on the guest's sys.path (python3.13 is on
// it) or beside what is.
var libEntries = map[string][]string{
	".":          {"python313.zip", "python3.13", ZoneDir},
	"python3.13": {"lib-dynload", "site-packages"},
}

// strays lists what lib holds beyond libEntries, and whatever lib-dynload holds
// (paths relative to lib).
func strays(lib string) ([]string, error) {
	var out []string
	for dir, want := range libEntries {
		ents, err := os.ReadDir(filepath.Join(lib, dir))
		if err != nil {
			return nil, err
		}
		for _, e := range ents {
			if !slices.Contains(want, e.Name()) {
				out = append(out, filepath.Join(dir, e.Name()))
			}
		}
	}
	ents, err := os.ReadDir(filepath.Join(lib, dynloadDir))
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		out = append(out, filepath.Join(dynloadDir, e.Name()))
	}
	return out, nil
}

// pruneLib removes the strays of lib: Install leaves the library exactly the pinned
// one.
func pruneLib(lib string) error {
	found, err := strays(lib)
	if err != nil {
		return fmt.Errorf("bundle: %w", err)
	}
	for _, p := range found {
		if err := os.RemoveAll(filepath.Join(lib, p)); err != nil {
			return fmt.Errorf("bundle: %w", err)
		}
	}
	return nil
}

// checkLib checks that lib has no strays. A difference wraps ErrMismatch.
func checkLib(lib string) error {
	found, err := strays(lib)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrMismatch, err)
	}
	if len(found) > 0 {
		return fmt.Errorf("%w: the library holds %s, which the pinned one does not", ErrMismatch, found[0])
	}
	return nil
}

// verifySite checks that the site layer unpacked in lib is the pinned one (its
// digest is Pinned's SiteTree) and that lib holds nothing else (checkLib). A
// difference wraps ErrMismatch.
func verifySite(lib string) error {
	if err := checkLib(lib); err != nil {
		return err
	}
	sum, err := siteDigest(lib)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: the site layer is not unpacked in %s (reinstall the bundle): %v", ErrMismatch, lib, err)
	}
	if err != nil {
		return err
	}
	if sum != Pinned().SiteTree {
		return fmt.Errorf("%w: the site layer in %s: digest %s, expected %s", ErrMismatch, lib, sum, Pinned().SiteTree)
	}
	return nil
}
