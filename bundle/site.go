package bundle

import (
	"archive/zip"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
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
// beside them, which then takes their place (a crash in between leaves the old
// layer, or no layer, which Verify then reports; never a mixture).
func unpackSite(site []byte, lib string) error {
	files, err := siteFiles(site)
	if err != nil {
		return err
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

// verifySite checks that the site layer unpacked in lib is site (site.zip's bytes,
// verified): every file of the zip is there with the same bytes, and siteRoots hold
// nothing else (no other file, no link). A difference wraps ErrMismatch.
func verifySite(site []byte, lib string) error {
	files, err := siteFiles(site)
	if err != nil {
		return err
	}
	seen := 0
	for _, r := range siteRoots {
		root := filepath.Join(lib, filepath.FromSlash(r))
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				return nil
			}
			rel, _ := filepath.Rel(lib, p)
			name := filepath.ToSlash(rel)
			f := files[name]
			if f == nil || !d.Type().IsRegular() {
				return fmt.Errorf("%w: the site layer holds %s, which %s does not", ErrMismatch, name, Pinned().Site.Name)
			}
			same, err := sameContent(f, p)
			if err != nil {
				return err
			}
			if !same {
				return fmt.Errorf("%w: the site layer's %s differs from %s", ErrMismatch, name, Pinned().Site.Name)
			}
			seen++
			return nil
		})
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w: the site layer is not unpacked in %s (reinstall the bundle): %v", ErrMismatch, lib, err)
		}
		if err != nil {
			return err
		}
	}
	if seen != len(files) {
		return fmt.Errorf("%w: the site layer lacks %d of %s's %d files", ErrMismatch, len(files)-seen, Pinned().Site.Name, len(files))
	}
	return nil
}

// sameContent reports whether the file at p holds f's bytes.
func sameContent(f *zip.File, p string) (bool, error) {
	st, err := os.Stat(p)
	if err != nil {
		return false, fmt.Errorf("bundle: %w", err)
	}
	if uint64(st.Size()) != f.UncompressedSize64 {
		return false, nil
	}
	want, err := f.Open()
	if err != nil {
		return false, fmt.Errorf("%w: %s: %v", ErrMismatch, f.Name, err)
	}
	defer want.Close()
	wb, err := io.ReadAll(want)
	if err != nil {
		return false, fmt.Errorf("%w: %s: %v", ErrMismatch, f.Name, err)
	}
	got, err := os.ReadFile(p)
	if err != nil {
		return false, fmt.Errorf("bundle: %w", err)
	}
	return bytes.Equal(wb, got), nil
}
