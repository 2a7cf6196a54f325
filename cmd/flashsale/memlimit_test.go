package main

import (
	"io"
	"log/slog"
	"runtime/debug"
	"strings"
	"testing"
)

func TestParseMemoryLimit(t *testing.T) {
	for in, want := range map[string]int64{
		"auto": -1, "": -1, "AUTO": -1, "off": 0, "0": 0,
		"240MiB": 240 << 20, "240mb": 240 << 20, "1GiB": 1 << 30, "2 GB": 2 << 30,
		"65536KiB": 64 << 20, "33554432": 32 << 20, "33554432b": 32 << 20,
	} {
		got, err := parseMemoryLimit(in)
		if err != nil || got != want {
			t.Errorf("parseMemoryLimit(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"lots", "-5MiB", "10MiB", "1.5GiB", "MiB", "12TB"} {
		if got, err := parseMemoryLimit(in); err == nil {
			t.Errorf("parseMemoryLimit(%q) = %d, want an error", in, got)
		}
	}
}

func TestMemoryLimitSetting(t *testing.T) {
	if _, err := parseConfig("serve", []string{"-memory-limit", "lots"}, func(string) string { return "" }, io.Discard, nil); err == nil || !strings.Contains(err.Error(), "memory-limit") {
		t.Fatalf("bad memory-limit: err %v, want one naming the setting", err)
	}
	cfg, err := parseConfig("serve", nil, func(k string) string {
		if k == "FLASHSALE_MEMORY_LIMIT" {
			return "300MiB"
		}
		return ""
	}, io.Discard, nil)
	if err != nil || cfg.MemoryLimit != "300MiB" {
		t.Fatalf("FLASHSALE_MEMORY_LIMIT: %q, %v", cfg.MemoryLimit, err)
	}
	if t.Setenv("GOMEMLIMIT", ""); true {
		prev := debug.SetMemoryLimit(-1)
		defer debug.SetMemoryLimit(prev)
		log := slog.New(slog.NewTextHandler(io.Discard, nil))
		if got := applyMemoryLimit(300<<20, log); got != 300<<20 || debug.SetMemoryLimit(-1) != 300<<20 {
			t.Fatalf("applyMemoryLimit(300MiB) = %d, runtime limit %d", got, debug.SetMemoryLimit(-1))
		}
	}
}
