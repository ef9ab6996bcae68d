package mcpserver

import (
	"bytes"
	"context"
	"fmt"
	"image"
	"image/png"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/image/draw"

	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/supervisor/tools"
)

// Agent hosts bound the images a tool result may carry (Claude's API: at most 8000
// pixels a side, and it scales anything over 1568 down itself; a few MB of base64
// in a message costs the context as much). A figure is shown to the model at most
// maxImageSide pixels on its longer side and maxImageBytes as PNG; the whole file
// stays in the workspace, linked.
const (
	maxImageSide  = 1568
	maxImageBytes = 1 << 20
)

// displayContent is what a model sees of a run's displays, in order: each PNG as
// an image (downscaled to fit, see maxImageSide) with a link to its whole file in
// workspace ws, each other display as text (clipped as the output is).
func displayContent(ctx context.Context, b Backend, ws string, ds []protocol.Display) ([]mcp.Content, string) {
	var out []mcp.Content
	var text strings.Builder
	for i, d := range ds {
		fmt.Fprintf(&text, "display %d: %s, %s (%d bytes)", i+1, d.Type, d.Path, d.Bytes)
		switch {
		case d.Type == "image/png":
			data, _, err := b.ReadFile(ctx, ws, d.Path, protocol.MaxDisplayBytes)
			if err == nil {
				data, err = fitImage(data)
			}
			if err != nil {
				fmt.Fprintf(&text, ": not shown (%v)\n", describe(err))
				continue
			}
			fmt.Fprintf(&text, ", %dx%d\n", d.Width, d.Height)
			out = append(out, &mcp.ImageContent{MIMEType: "image/png", Data: data},
				&mcp.ResourceLink{URI: "sandcell://workspaces/" + ws + "/files/" + d.Path, Name: d.Path,
					MIMEType: d.Type, Size: &d.Bytes,
					Description: "the whole figure (read_file with encoding base64 reads it)"})
		case d.Text != "":
			fmt.Fprintf(&text, ":\n%s\n", tools.Clip([]byte(d.Text), 4<<10))
		default:
			text.WriteString(" (read_file reads it)\n")
		}
	}
	return out, text.String()
}

// fitImage returns png as it is when it fits (maxImageSide, maxImageBytes), else
// scaled down (Catmull-Rom) to fit and encoded again.
func fitImage(data []byte) ([]byte, error) {
	cfg, err := png.DecodeConfig(bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	if max(cfg.Width, cfg.Height) <= maxImageSide && len(data) <= maxImageBytes {
		return data, nil
	}
	// What was read may not be what the daemon checked (the guest can replace the
	// file in between): its size is checked again before it is decoded.
	if int64(cfg.Width)*int64(cfg.Height) > protocol.MaxDisplayPixels {
		return nil, fmt.Errorf("%dx%d pixels, over %d", cfg.Width, cfg.Height, protocol.MaxDisplayPixels)
	}
	src, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	for side := maxImageSide; side >= 64; side /= 2 {
		w, h := cfg.Width, cfg.Height
		if s := max(w, h); s > side {
			w, h = max(w*side/s, 1), max(h*side/s, 1)
		}
		dst := image.NewRGBA(image.Rect(0, 0, w, h))
		draw.CatmullRom.Scale(dst, dst.Bounds(), src, src.Bounds(), draw.Src, nil)
		var buf bytes.Buffer
		enc := png.Encoder{CompressionLevel: png.BestCompression}
		if err := enc.Encode(&buf, dst); err != nil {
			return nil, err
		}
		if buf.Len() <= maxImageBytes {
			return buf.Bytes(), nil
		}
	}
	return nil, fmt.Errorf("no smaller PNG fits in %d bytes", maxImageBytes)
}
