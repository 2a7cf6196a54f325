package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"text/tabwriter"
)

// runReconcile runs one reconcile pass on a running instance (through its
// admin API, so it uses that instance's view of in-flight work) and prints
// the report.
func runReconcile(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("reconcile", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url, token := adminFlags(fs, getenv)
	asJSON := fs.Bool("json", false, "print the API's JSON")
	fs.Usage = func() { commandUsage(fs, "reconcile") }
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return noArguments(fs)
	}
	if *token == "" {
		return errNoAdminToken
	}
	body, err := adminRequest(ctx, *url, *token, http.MethodPost, "/admin/v1/reconcile")
	if err != nil {
		return err
	}
	if *asJSON {
		_, err = stdout.Write(body)
		return err
	}
	var rep struct {
		SKUs []struct {
			SKU            string `json:"sku_id"`
			RedisAvailable int64  `json:"redis_available"`
			DBStock        int64  `json:"db_stock"`
			InFlight       int64  `json:"in_flight"`
			Drift          int64  `json:"drift"`
			Action         string `json:"action"`
		} `json:"skus"`
	}
	if err := json.Unmarshal(body, &rep); err != nil {
		return fmt.Errorf("unexpected answer from the admin API: %w", err)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SKU\tREDIS\tDATABASE\tIN FLIGHT\tDRIFT\tACTION")
	for _, s := range rep.SKUs {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\n", s.SKU, s.RedisAvailable, s.DBStock, s.InFlight, s.Drift, s.Action)
	}
	return tw.Flush()
}
