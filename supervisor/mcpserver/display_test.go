package mcpserver

import (
	"bytes"
	"image"
	"image/color"
	"image/png"
	"math/rand/v2"
	"testing"
)

// A figure over the hosts' bounds reaches the model scaled down to fit them; one
// within them, byte for byte.
func TestFitImage(t *testing.T) {
	mk := func(w, h int, noise bool) []byte {
		img := image.NewRGBA(image.Rect(0, 0, w, h))
		r := rand.New(rand.NewPCG(1, 2))
		for y := range h {
			for x := range w {
				c := color.RGBA{uint8(x), uint8(y), 128, 255}
				if noise {
					c = color.RGBA{uint8(r.Uint32()), uint8(r.Uint32()), uint8(r.Uint32()), 255}
				}
				img.Set(x, y, c)
			}
		}
		var buf bytes.Buffer
		png.Encode(&buf, img)
		return buf.Bytes()
	}
	small := mk(640, 480, false)
	if got, err := fitImage(small); err != nil || !bytes.Equal(got, small) {
		t.Fatalf("a small figure changed: %v", err)
	}
	for _, big := range [][]byte{mk(4000, 3000, false), mk(1200, 1200, true)} {
		got, err := fitImage(big)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := png.DecodeConfig(bytes.NewReader(got))
		if err != nil || max(cfg.Width, cfg.Height) > maxImageSide || len(got) > maxImageBytes {
			t.Fatalf("%dx%d, %d bytes (%v)", cfg.Width, cfg.Height, len(got), err)
		}
	}
}
