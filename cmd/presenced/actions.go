package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	neturl "net/url"
	"strings"
	"time"

	"github.com/presenced/presenced/internal/app"
	"github.com/presenced/presenced/internal/auth"
	"github.com/presenced/presenced/internal/buildinfo"
	"github.com/presenced/presenced/internal/presence"
)

// version is the module version the binary was built from (or "devel"),
// its VCS revision and time when known, and the Go release: the same
// build information /metrics exports as presenced_build_info.
func version() string { return buildinfo.Read().String() }

// checkPrintToken refuses a -print-token user id that is none, and
// -print-token-rooms that are none or without -print-token, before
// anything else is done.
func (o *options) checkPrintToken() error {
	if o.printToken == "" {
		if len(o.printTokenRooms) > 0 {
			return errors.New("-print-token-rooms is the rooms claim of -print-token's token: give -print-token too")
		}
		return nil
	}
	if err := presence.ValidateID(o.printToken); err != nil {
		return fmt.Errorf("-print-token %q: %v", o.printToken, err)
	}
	if _, err := auth.ParseRooms(o.printTokenRooms); err != nil {
		return fmt.Errorf("-print-token-rooms: %v", err)
	}
	return nil
}

// signToken prints a client token for user (with the rooms claim rooms,
// when given), signed with cfg's JWT secret, valid for its maximum
// lifetime, with its audience and issuer.
func signToken(stdout io.Writer, user string, rooms []string, cfg app.Config) error {
	t := auth.Token{User: user, Audience: cfg.TokenAudience, Issuer: cfg.TokenIssuer, Rooms: rooms}
	tok, err := t.Sign(cfg.JWTSecret, time.Now(), cfg.MaxTokenLifetime)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, tok)
	return nil
}

// healthcheck GETs url and succeeds only on a 200 answer: the container
// image's HEALTHCHECK (the image holds the binary alone, no curl).
func healthcheck(ctx context.Context, url string, stdout io.Writer) error {
	u, err := neturl.Parse(url)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("-healthcheck %q: give an http:// or https:// URL, e.g. http://127.0.0.1:8081/healthz", url)
	}
	ctx, cancel := context.WithTimeout(ctx, healthcheckTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("-healthcheck: %v", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("-healthcheck: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("-healthcheck %s: %s %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	fmt.Fprintf(stdout, "%s: %s %s\n", url, resp.Status, strings.TrimSpace(string(body)))
	return nil
}

// healthcheckTimeout bounds -healthcheck's request (a container engine
// kills a check that outlives its own timeout anyway).
const healthcheckTimeout = 5 * time.Second
