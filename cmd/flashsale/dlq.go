package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// runDLQ lists, replays and discards dead letters through a running
// instance's admin API (so the same rules apply as for the HTTP routes).
func runDLQ(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("dlq", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url, token := adminFlags(fs, getenv)
	asJSON := fs.Bool("json", false, "print the API's JSON")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: flashsale dlq [flags] list | replay SEQ | discard SEQ")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	rest := fs.Args()
	var method, path string
	switch {
	case len(rest) == 0:
		return errors.New("dlq needs an action: list, replay SEQ or discard SEQ (flashsale dlq -h)")
	case rest[0] == "list" && len(rest) == 1:
		method, path = http.MethodGet, "/admin/v1/dlq?limit=1000"
	case rest[0] == "list":
		return fmt.Errorf("dlq list takes no arguments, got %q (flags go before the action)", rest[1:])
	case rest[0] == "replay" || rest[0] == "discard":
		if len(rest) != 2 {
			return fmt.Errorf("dlq %s needs one SEQ, a dead letter's sequence number (see dlq list), got %d arguments", rest[0], len(rest)-1)
		}
		if _, err := strconv.ParseUint(rest[1], 10, 64); err != nil {
			return fmt.Errorf("SEQ must be a dead letter's sequence number (see dlq list), got %q", rest[1])
		}
		method, path = http.MethodPost, "/admin/v1/dlq/"+rest[1]+"/"+rest[0]
	default:
		return fmt.Errorf("dlq: unknown action %q: want list, replay SEQ or discard SEQ", rest[0])
	}
	if *token == "" {
		return errNoAdminToken
	}
	body, err := adminRequest(ctx, *url, *token, method, path)
	if err != nil {
		return err
	}
	if *asJSON || rest[0] != "list" {
		_, err = stdout.Write(body)
		return err
	}
	var list struct {
		Count       uint64 `json:"count"`
		DeadLetters []struct {
			Seq        uint64    `json:"seq"`
			OrderID    string    `json:"order_id"`
			SKU        string    `json:"sku_id"`
			Deliveries int       `json:"deliveries"`
			FailedAt   time.Time `json:"failed_at"`
			Reason     string    `json:"reason"`
		} `json:"dead_letters"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return errors.New("unexpected answer from the admin API: " + err.Error())
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tORDER\tSKU\tDELIVERIES\tFAILED AT\tREASON")
	for _, d := range list.DeadLetters {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\n", d.Seq, d.OrderID, d.SKU, d.Deliveries, d.FailedAt.Format(time.RFC3339), d.Reason)
	}
	tw.Flush()
	fmt.Fprintf(stdout, "%d dead letter(s)\n", list.Count)
	return nil
}

// errNoAdminToken is the error of an admin subcommand run without a token:
// said before anything is sent (the API would answer 401).
var errNoAdminToken = errors.New("the admin API needs its token: set FLASHSALE_ADMIN_TOKEN (or -admin-token) to the running instance's admin token")

// adminRequest calls a running instance's admin API and returns the body of
// a 200 answer; any other answer is an error quoting the API's error.
func adminRequest(ctx context.Context, base, token, method, path string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(base, "/")+path, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%s gave no answer in time: is it running and is -url right?", base)
		}
		return nil, fmt.Errorf("cannot reach flashsale at %s: is it running there (flashsale serve) and is -url (or FLASHSALE_URL) right?", base)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s %s: HTTP %d: %s", method, path, resp.StatusCode, strings.TrimSpace(string(body)))
	}
	return body, nil
}

// adminFlags are the flags of subcommands that talk to the admin API.
func adminFlags(fs *flag.FlagSet, getenv func(string) string) (url, token *string) {
	def := getenv("FLASHSALE_URL")
	if def == "" {
		def = "http://127.0.0.1:8080"
	}
	url = fs.String("url", def, "base URL of a running flashsale ($FLASHSALE_URL)")
	tok := getenv("FLASHSALE_ADMIN_TOKEN")
	secretVar(fs, &tok, "admin-token", "FLASHSALE_ADMIN_TOKEN", "admin `token`")
	return url, &tok
}
