package api

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"

	"github.com/BurntSushi/toml"
)

// Token is a bearer token a TCP caller may present (RFC 6750), as configured: only
// the SHA-256 of the secret is kept, so the tokens file reveals no secret.
type Token struct {
	// Name identifies the token's caller in the audit log and owns its runs.
	Name string `toml:"name"`
	// SHA256 is the hex SHA-256 of the secret.
	SHA256 string `toml:"sha256"`
	// Roles are the roles the token grants ("runner", "approver", "admin").
	Roles []Role `toml:"roles"`
}

func (t Token) has(r Role) bool { return slices.Contains(t.Roles, r) }

// Tokens is the set of configured tokens.
type Tokens []Token

// Validate reports the first problem: a name repeated or empty, a hash that is not
// 64 hex digits, an unknown role.
func (ts Tokens) Validate() error {
	seen := map[string]bool{}
	for i, t := range ts {
		if t.Name == "" || seen[t.Name] {
			return fmt.Errorf("token %d: name %q is empty or repeated", i+1, t.Name)
		}
		seen[t.Name] = true
		if b, err := hex.DecodeString(t.SHA256); err != nil || len(b) != sha256.Size {
			return fmt.Errorf("token %q: sha256 must be 64 hex digits", t.Name)
		}
		if len(t.Roles) == 0 {
			return fmt.Errorf("token %q: no roles", t.Name)
		}
		for _, r := range t.Roles {
			if r != RoleRunner && r != RoleApprover && r != RoleAdmin {
				return fmt.Errorf("token %q: unknown role %q", t.Name, r)
			}
		}
	}
	return nil
}

func (ts Tokens) named(name string) (Token, bool) {
	for _, t := range ts {
		if t.Name == name {
			return t, true
		}
	}
	return Token{}, false
}

// Authenticate returns the token whose secret the request's "Authorization: Bearer"
// header carries. Every configured hash is compared in constant time, so the time
// taken says nothing about which (or whether one) matched.
func (ts Tokens) Authenticate(r *http.Request) (Token, bool) {
	scheme, secret, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || secret == "" {
		return Token{}, false
	}
	sum := sha256.Sum256([]byte(secret))
	var found Token
	match := 0
	for _, t := range ts {
		want, _ := hex.DecodeString(t.SHA256)
		if subtle.ConstantTimeCompare(sum[:], want) == 1 {
			found, match = t, 1
		}
	}
	return found, match == 1
}

// NewToken returns a new random secret (32 bytes, base64url) and its Token entry.
func NewToken(name string, roles []Role) (secret string, t Token) {
	b := make([]byte, 32)
	rand.Read(b)
	secret = base64.RawURLEncoding.EncodeToString(b)
	sum := sha256.Sum256([]byte(secret))
	return secret, Token{Name: name, SHA256: hex.EncodeToString(sum[:]), Roles: roles}
}

// LoadTokens reads a tokens file: TOML with one [[token]] table per token (name,
// sha256, roles), decoded strictly. The file must be a regular file that neither its
// group nor others may write (a writer could add a token). `sandcell token new`
// prints an entry.
func LoadTokens(path string) (Tokens, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("tokens file: %w", err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o022 != 0 {
		return nil, fmt.Errorf("tokens file %s: must be a regular file writable only by its owner (mode %v)", path, fi.Mode())
	}
	var f struct {
		Token Tokens `toml:"token"`
	}
	md, err := toml.DecodeFile(path, &f)
	if err != nil {
		return nil, fmt.Errorf("tokens file %s: %w", path, err)
	}
	if extra := md.Undecoded(); len(extra) > 0 {
		return nil, fmt.Errorf("tokens file %s: unknown key %s", path, extra[0])
	}
	if err := f.Token.Validate(); err != nil {
		return nil, fmt.Errorf("tokens file %s: %w", path, err)
	}
	if len(f.Token) == 0 {
		return nil, fmt.Errorf("tokens file %s: no [[token]]", path)
	}
	return f.Token, nil
}
