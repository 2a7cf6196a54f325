package room

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
)

// The lottery orders the buyers who joined before the opening: the buyer
// with join number j (1..P) gets position perm(j-1)+1, where perm is a keyed
// permutation of [0,P) fixed once at the opening (P and the keys are written
// once into the room's state; nothing is written per buyer). perm is a
// balanced Feistel network over [0,H*H), H = 2^h the smallest power of two
// with H*H >= P, restricted to [0,P) by cycle walking (apply it again until
// the value falls inside; at most N/P < 4 applications on average). The
// same arithmetic runs in lottery.lua, inside the poll script, so every
// number stays below 2^53 (exact in Lua's doubles): the round function
// squares residues modulo a prime below 2^20.

const (
	lotteryRounds = 4
	lotteryPrime  = 1048573 // the largest prime below 2^20
)

// lotteryKeys are the round keys of one lottery: two per round, each below
// lotteryPrime. They are the "seed" recorded at the opening.
type lotteryKeys [2 * lotteryRounds]uint64

// newLotteryKeys draws keys from crypto/rand (the lottery decides who buys:
// it must not be predictable).
func newLotteryKeys() lotteryKeys {
	var b [8 * 2 * lotteryRounds]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on supported systems
	}
	var k lotteryKeys
	for i := range k {
		k[i] = binary.LittleEndian.Uint64(b[8*i:]) % lotteryPrime
	}
	return k
}

// String is the form stored in Redis and read by lottery.lua.
func (k lotteryKeys) String() string {
	parts := make([]string, len(k))
	for i, v := range k {
		parts[i] = strconv.FormatUint(v, 10)
	}
	return strings.Join(parts, ",")
}

func parseLotteryKeys(s string) (lotteryKeys, error) {
	var k lotteryKeys
	parts := strings.Split(s, ",")
	if len(parts) != len(k) {
		return k, fmt.Errorf("room: lottery seed %q: want %d keys", s, len(k))
	}
	for i, p := range parts {
		v, err := strconv.ParseUint(p, 10, 64)
		if err != nil || v >= lotteryPrime {
			return k, fmt.Errorf("room: lottery seed %q: bad key %q", s, p)
		}
		k[i] = v
	}
	return k, nil
}

// lotteryHalf returns H for a lottery of p: the smallest power of two
// (at least 2) with H*H >= p.
func lotteryHalf(p uint64) uint64 {
	h := uint64(2)
	for h*h < p {
		h <<= 1
	}
	return h
}

func (k lotteryKeys) feistel(x, half uint64) uint64 {
	l, r := x/half, x%half
	for i := 0; i < lotteryRounds; i++ {
		t := (r + k[2*i]) % lotteryPrime
		t = t * t % lotteryPrime
		t = (t*t + k[2*i+1]) % lotteryPrime
		l, r = r, (l+t)%half
	}
	return l*half + r
}

// perm maps x in [0,p) to its place in [0,p): a bijection for each p and k.
func (k lotteryKeys) perm(x, p uint64) uint64 {
	if p <= 1 {
		return 0
	}
	half := lotteryHalf(p)
	y := k.feistel(x, half)
	for y >= p {
		y = k.feistel(y, half)
	}
	return y
}
