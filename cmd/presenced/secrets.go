package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/presenced/presenced/internal/app"
	"github.com/presenced/presenced/internal/auth"
)

// credentials sets c's API key and JWT secret: the given ones, else those
// stored under the data directory, else new ones generated there. Outside
// -dev a short one is refused (a short key is guessable, and a short
// HS256 secret below the algorithm's strength, RFC 7518 §3.2; generated
// ones are 48 bytes): given ones before anything is written to the data
// directory, stored ones once they are read.
func (o *options) credentials(c *app.Config, log *slog.Logger) error {
	if !c.Dev {
		for _, f := range [...]struct{ name, value string }{{"api-key", o.apiKey}, {"jwt-secret", o.jwtSecret}} {
			if f.value != "" {
				if err := checkSecret(f.name, f.value, f.value, c.DataDir); err != nil {
					return err
				}
			}
		}
	}
	if err := os.MkdirAll(c.DataDir, 0o755); err != nil {
		return fmt.Errorf("data directory: %w", err)
	}
	key, err := secret(o.apiKey, filepath.Join(c.DataDir, "api-key"), log)
	if err != nil {
		return err
	}
	jwtKey, err := secret(o.jwtSecret, filepath.Join(c.DataDir, "jwt-secret"), log)
	if err != nil {
		return err
	}
	if !c.Dev {
		if err := checkSecret("api-key", o.apiKey, key, c.DataDir); err != nil {
			return err
		}
		if err := checkSecret("jwt-secret", o.jwtSecret, jwtKey, c.DataDir); err != nil {
			return err
		}
	}
	c.APIKey, c.JWTSecret = key, []byte(jwtKey)
	return nil
}

// secret returns the given value, or the one stored in path, or a new
// random one written to path (mode 0600) so that it survives restarts.
func secret(given, path string, log *slog.Logger) (string, error) {
	if given != "" {
		return given, nil
	}
	b, err := os.ReadFile(path)
	if err == nil {
		if s := strings.TrimSpace(string(b)); s != "" {
			return s, nil
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	raw := make([]byte, 24)
	if _, err := rand.Read(raw); err != nil {
		return "", err
	}
	s := hex.EncodeToString(raw)
	if err := os.WriteFile(path, []byte(s+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	log.Info("generated a new secret", "file", path)
	return s, nil
}

// checkSecret refuses a credential shorter than auth.MinSecretLen, naming
// where it came from: the flag or its environment variable (given), or
// the file under the data directory.
func checkSecret(flagName, given, value, dataDir string) error {
	err := auth.CheckSecret([]byte(value))
	if err == nil {
		return nil
	}
	if given != "" {
		return fmt.Errorf("-%s (%s) is %w", flagName, envName(flagName), err)
	}
	return fmt.Errorf("%s (the stored -%s) is %w; give a longer one with -%s, or remove the file to have one generated", filepath.Join(dataDir, flagName), flagName, err, flagName)
}
