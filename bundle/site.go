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

// siteDigest is the digest of the site layer unpacked in lib: the SHA-256 of its
// files' list, sorted by name, one line each of name, size and SHA-256 (hex); Verify
// compares it with Pinned's SiteTree. A link or any other file that is not regular is
// an error wrapping ErrMismatch; a layer not unpacked one wrapping fs.ErrNotExist.
func siteDigest(lib string) (string, error) {
	var lines []string
	for _, r := range siteRoots {
		root := filepath.Join(lib, filepath.FromSlash(r))
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			rel, _ := filepath.Rel(lib, p)
			if !d.Type().IsRegular() {
				return fmt.Errorf("%w: the site layer's %s is not a regular file", ErrMismatch, filepath.ToSlash(rel))
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
			lines = append(lines, fmt.Sprintf("%s %d %x\n", filepath.ToSlash(rel), n, h.Sum(nil)))
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

// verifySite checks that the site layer unpacked in lib is the pinned one (its
// digest is Pinned's SiteTree). A difference wraps ErrMismatch.
func verifySite(lib string) error {
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
