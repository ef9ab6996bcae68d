package sandbox

import (
	"fmt"
	"image"
	_ "image/png" // image.DecodeConfig of a display's PNG
	"io"
	"io/fs"
	"os"
	"slices"
	"strings"
	"syscall"
	"unicode/utf8"

	"github.com/sandcell/sandcell/sandbox/protocol"
)

// checkDisplays turns the displays a native guest's runner named (untrusted) into
// the Result's: each must be a known type, a regular file under displays/ of the
// workspace open as dir (opened through os.Root, so no link leads out of it), of at
// most MaxDisplayBytes, a PNG that decodes to at most MaxDisplayPixels, text that is
// UTF-8. What fails is left out and said in a diagnostic.
func checkDisplays(dir *os.File, items []protocol.Display) ([]protocol.Display, []string) {
	if len(items) == 0 {
		return nil, nil
	}
	var diags []string
	if len(items) > protocol.MaxDisplays {
		diags = append(diags, fmt.Sprintf("%d displays: the first %d are kept", len(items), protocol.MaxDisplays))
		items = items[:protocol.MaxDisplays]
	}
	root, err := os.OpenRoot(fmt.Sprintf("/proc/self/fd/%d", dir.Fd()))
	if err != nil {
		return nil, append(diags, "displays: "+err.Error())
	}
	defer root.Close()
	var out []protocol.Display
	for _, d := range items {
		got, err := checkDisplay(root, d)
		if err != nil {
			diags = append(diags, fmt.Sprintf("display %q left out: %v", d.Path, err))
			continue
		}
		out = append(out, got)
	}
	return out, diags
}

func checkDisplay(root *os.Root, d protocol.Display) (protocol.Display, error) {
	if !slices.Contains(protocol.DisplayTypes(), d.Type) {
		return d, fmt.Errorf("type %q is not one of %v", d.Type, protocol.DisplayTypes())
	}
	if !fs.ValidPath(d.Path) || !strings.HasPrefix(d.Path, "displays/") {
		return d, fmt.Errorf("not a path under displays/")
	}
	// O_NONBLOCK: a FIFO named as a display must not hold the parent (its open
	// would wait for a writer); it is then refused as not a regular file.
	f, err := root.OpenFile(d.Path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return d, err
	}
	defer f.Close()
	st, err := f.Stat()
	switch {
	case err != nil:
		return d, err
	case !st.Mode().IsRegular():
		return d, fmt.Errorf("not a regular file")
	case st.Size() > protocol.MaxDisplayBytes:
		return d, fmt.Errorf("%d bytes, over %d", st.Size(), protocol.MaxDisplayBytes)
	}
	out := protocol.Display{Type: d.Type, Path: d.Path, Bytes: st.Size()}
	switch d.Type {
	case "image/png":
		cfg, format, err := image.DecodeConfig(f)
		if err != nil || format != "png" {
			return d, fmt.Errorf("not a PNG image (%v)", err)
		}
		if int64(cfg.Width)*int64(cfg.Height) > protocol.MaxDisplayPixels {
			return d, fmt.Errorf("%dx%d pixels, over %d", cfg.Width, cfg.Height, protocol.MaxDisplayPixels)
		}
		out.Width, out.Height = cfg.Width, cfg.Height
	case "text/plain", "text/html", "application/json":
		if st.Size() <= protocol.MaxDisplayText {
			b, err := io.ReadAll(io.LimitReader(f, protocol.MaxDisplayText))
			if err == nil && utf8.Valid(b) {
				out.Text = string(b)
			}
		}
	}
	return out, nil
}
