package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/flashsale/flashsale/internal/httpapi"
	"github.com/flashsale/flashsale/internal/sale"
)

func runToken(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var user string
	var ttl time.Duration
	cfg, err := parseConfig("token", args, getenv, stderr, func(fs *flag.FlagSet) {
		fs.StringVar(&user, "user", "", "user id (the token's sub)")
		fs.DurationVar(&ttl, "ttl", time.Hour, "validity")
	})
	if err != nil {
		return err
	}
	if cfg.UserTokenSecret == "" {
		return errors.New("FLASHSALE_USER_TOKEN_SECRET (or -user-token-secret) is required")
	}
	if ttl <= 0 {
		return fmt.Errorf("-ttl must be positive (a token valid for %s would be expired when printed)", ttl)
	}
	if !sale.ValidUser(user) {
		return errors.New("-user must be 1-128 characters of A-Z a-z 0-9 _ . @ -")
	}
	tok, err := httpapi.Sign(cfg.UserTokenSecret, user, ttl)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, tok)
	return nil
}
