package room

import (
	"context"
	"math/big"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/flashsale/flashsale/internal/testenv"
)

func TestLotteryPrime(t *testing.T) {
	if !big.NewInt(lotteryPrime).ProbablyPrime(20) || lotteryPrime >= 1<<20 {
		t.Fatalf("%d is not a prime below 2^20", lotteryPrime)
	}
}

func testKeys(seed uint64) lotteryKeys {
	rng := rand.New(rand.NewPCG(seed, 7))
	var k lotteryKeys
	for i := range k {
		k[i] = rng.Uint64N(lotteryPrime)
	}
	return k
}

// TestLotteryBijection: perm is a permutation of [0,p) for many sizes and
// seeds (powers of two, their neighbours, primes).
func TestLotteryBijection(t *testing.T) {
	sizes := []uint64{1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 100, 255, 256, 257, 1000, 4095, 4096, 4097, 65537}
	for _, p := range sizes {
		seeds := 25
		if p > 10000 {
			seeds = 4
		}
		for s := range seeds {
			k := testKeys(uint64(s))
			if s == 0 {
				k = lotteryKeys{} // all-zero keys too
			}
			seen := make([]bool, p)
			for x := range p {
				y := k.perm(x, p)
				if y >= p || seen[y] {
					t.Fatalf("p=%d seed=%d: perm(%d)=%d out of range or repeated", p, s, x, y)
				}
				seen[y] = true
			}
		}
	}
}

// TestLotteryUniform is a sanity check, not a statistical proof: over many
// seeds, the first joiner lands in every place about equally often, and
// a seed moves most joiners.
func TestLotteryUniform(t *testing.T) {
	const p, seeds = 10, 20000
	var counts [p]int
	fixed := 0
	for s := range seeds {
		k := testKeys(uint64(s) + 1000)
		counts[k.perm(0, p)]++
		if k.perm(5, p) == 5 {
			fixed++
		}
	}
	for place, n := range counts {
		if n < seeds/p*8/10 || n > seeds/p*12/10 {
			t.Errorf("joiner 0 in place %d %d times of %d, want about %d", place, n, seeds, seeds/p)
		}
	}
	if fixed > seeds/p*12/10 {
		t.Errorf("joiner 5 kept its place %d times of %d, want about %d", fixed, seeds, seeds/p)
	}
}

func TestLotteryKeysRoundTrip(t *testing.T) {
	k := newLotteryKeys()
	got, err := parseLotteryKeys(k.String())
	if err != nil || got != k {
		t.Fatalf("parse(%q) = %v, %v", k.String(), got, err)
	}
	for _, bad := range []string{"", "1,2", "1,2,3,4,5,6,7,x", "1,2,3,4,5,6,7,1048573"} {
		if _, err := parseLotteryKeys(bad); err == nil {
			t.Errorf("parse(%q) accepted", bad)
		}
	}
}

// TestLotteryLuaMatchesGo: lottery.lua computes the same permutation as
// lottery.go on a real redis-server (whose Lua numbers are doubles).
func TestLotteryLuaMatchesGo(t *testing.T) {
	url, _ := testenv.Redis(t)
	c := testenv.RedisClient(t, url)
	src := lotteryLua + `
local out = {}
local p = tonumber(ARGV[1])
for x = 0, p - 1 do out[#out + 1] = perm(x, p, ARGV[2]) end
return out`
	for _, p := range []uint64{1, 2, 3, 10, 1000, 5000} {
		for s := range 3 {
			k := testKeys(uint64(s) + 99)
			if s == 2 {
				for i := range k {
					k[i] = lotteryPrime - 1 // the largest intermediates
				}
			}
			v, err := c.Do(context.Background(), c.B().Eval().Script(src).Numkeys(0).
				Arg(strconv.FormatUint(p, 10), k.String()).Build()).AsIntSlice()
			if err != nil {
				t.Fatal(err)
			}
			var diff []string
			for x := range p {
				if uint64(v[x]) != k.perm(x, p) {
					diff = append(diff, strconv.FormatUint(x, 10))
				}
			}
			if len(diff) > 0 {
				t.Fatalf("p=%d seed=%d: Lua and Go differ at %s", p, s, strings.Join(diff[:min(10, len(diff))], ","))
			}
		}
	}
}
