// Package altcha issues ALTCHA proof-of-work challenges and verifies the
// solutions that the altcha web widget (npm altcha 3.2.2) submits, with the
// standard library only. Its wire formats are those of the reference server
// library altcha-lib 2.8.0; docs/altcha.md describes them and how the test
// vectors in testdata were made with both packages.
//
// Two formats exist and the widget solves both:
//
//   - V2, the widget's native format and altcha-lib's default: the challenge
//     is {"parameters":{...},"signature":hex}, the signature an HMAC-SHA256
//     over the parameters' JSON with sorted keys, so every parameter (the
//     expiry and the bound data too) is signed directly. The client looks
//     for the counter whose derived key (PBKDF2-SHA256 or iterated SHA-256
//     of the nonce and the counter, salted) starts with keyPrefix.
//   - V1, the classic format (altcha-lib/v1): the client looks for the number
//     with sha256(salt+number) equal to the challenge; the signature is an
//     HMAC of the challenge, so the salt, which carries the bound parameters
//     and the expiry as a query string, is covered through the hash.
//
// An Issuer creates challenges and verifies payloads with one HMAC key. It
// does not remember payloads: a solved payload verifies again until it
// expires, so a caller that must not accept one twice keeps Result.ID until
// Result.Expires.
package altcha

import (
	"bytes"
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Key derivation algorithms of V2 challenges this package issues and
// verifies. V1 challenges are always SHA-256.
const (
	AlgorithmPBKDF2SHA256 = "PBKDF2/SHA-256"
	AlgorithmSHA256       = "SHA-256"
)

// Errors of Verify. Each failed verification wraps exactly one of them.
var (
	// ErrMalformed: the payload is not base64 of a JSON solution of either
	// format, or a field has the wrong type or an impossible value.
	ErrMalformed = errors.New("altcha: malformed payload")
	// ErrBadSignature: the challenge was not signed with this Issuer's key,
	// or was changed after signing.
	ErrBadSignature = errors.New("altcha: bad signature")
	// ErrWrongSolution: the challenge is authentic but the number or derived
	// key does not solve it. In V1 a changed salt ends here too, since the
	// signature covers the salt only through the challenge hash.
	ErrWrongSolution = errors.New("altcha: wrong solution")
	// ErrExpired: an authentic, solved challenge past its expiry.
	ErrExpired = errors.New("altcha: challenge expired")
)

const (
	maxPayload   = 8 << 10 // bytes of base64; real payloads are under 1 KiB
	maxCost      = 1 << 22 // bound on a V2 cost, issued or verified
	maxKeyLength = 64
	// keyLength of V2 keys: the widget's PBKDF2 worker derives an AES key (16,
	// 24 or 32 bytes) and its SHA-256 worker agrees with altcha-lib only at 32.
	keyLength = 32
	// Defaults, measured with the widget in headless Chromium on 2 cores
	// (docs/altcha.md): PBKDF2 takes about 1.2 ms per derivation at cost 5000,
	// and a mean of 250 derivations is what altcha-lib's default random "00"
	// key prefix needs; a SHA-256 call, one per V1 number or V2 round, about
	// 20 µs, so V1 keeps to 100,000 numbers (altcha-lib/v1's 1,000,000 took
	// 20 s) and V2 SHA-256 to one round.
	defaultCostPBKDF2 = 5000
	defaultMaxPBKDF2  = 500
	defaultMaxSHA256  = 100_000
)

// Options of a new challenge. Zero values take the defaults given.
type Options struct {
	// V1 selects the classic format; the default is V2.
	V1 bool
	// Algorithm of a V2 challenge: AlgorithmPBKDF2SHA256 (default) or
	// AlgorithmSHA256. A V1 challenge is always SHA-256.
	Algorithm string
	// Cost of one V2 derivation: PBKDF2 iterations (default 5000) or SHA-256
	// rounds (default 1). A V1 attempt is one SHA-256.
	Cost int
	// The secret number (V1) or counter (V2) is drawn uniformly from
	// [MinNumber, MaxNumber]; a client tries 0, 1, 2, ... so its work is that
	// number of attempts. MaxNumber defaults to 500 with PBKDF2 and to 100,000
	// with SHA-256 (V1 or V2).
	MinNumber, MaxNumber uint32
	// Expires is when the challenge stops verifying. Required.
	Expires time.Time
	// Params are bound to the challenge and signed (V1: in the salt's query
	// string; V2: the parameters' data), and Verify returns them. Keys are a
	// letter then letters, digits, '_', '-' or '.', at most 64 bytes, and not
	// "expires" or "expire"; values are printable ASCII, at most 256 bytes.
	Params map[string]string
}

// Result of a successful verification.
type Result struct {
	// Params bound at creation (never nil).
	Params map[string]string
	// Expires is the challenge's expiry.
	Expires time.Time
	// ID identifies the challenge (its signature): a replay store keys on it.
	ID string
}

// Issuer creates and verifies challenges with one HMAC key.
type Issuer struct {
	key []byte
}

// New returns an Issuer signing with key, at least 16 bytes (32 random bytes
// recommended). altcha-lib's secret string is the same key as its UTF-8 bytes.
func New(key []byte) (*Issuer, error) {
	if len(key) < 16 {
		return nil, errors.New("altcha: HMAC key shorter than 16 bytes")
	}
	return &Issuer{key: bytes.Clone(key)}, nil
}

// challengeV1 is the JSON of a V1 challenge, as altcha-lib/v1 makes it.
type challengeV1 struct {
	Algorithm string `json:"algorithm"`
	Challenge string `json:"challenge"`
	MaxNumber uint64 `json:"maxnumber"`
	Salt      string `json:"salt"`
	Signature string `json:"signature"`
}

// parameters of a V2 challenge; canonical gives the bytes that are signed.
type parameters struct {
	Algorithm string            `json:"algorithm"`
	Cost      int64             `json:"cost"`
	Data      map[string]string `json:"data,omitempty"`
	ExpiresAt int64             `json:"expiresAt,omitempty"`
	KeyLength int64             `json:"keyLength"`
	KeyPrefix string            `json:"keyPrefix"`
	Nonce     string            `json:"nonce"`
	Salt      string            `json:"salt"`
}

// challengeV2 is the JSON of a V2 challenge, as altcha-lib makes it.
type challengeV2 struct {
	Parameters parameters `json:"parameters"`
	Signature  string     `json:"signature"`
}

// Create returns a new challenge as the JSON the widget fetches.
func (s *Issuer) Create(o Options) (json.RawMessage, error) {
	if o.Expires.Unix() <= 0 {
		return nil, errors.New("altcha: Options.Expires is required")
	}
	if err := checkParams(o.Params); err != nil {
		return nil, err
	}
	alg, cost, hi := o.Algorithm, int64(o.Cost), o.MaxNumber
	if alg == "" {
		alg = AlgorithmPBKDF2SHA256
	}
	if cost == 0 {
		cost = 1
		if alg == AlgorithmPBKDF2SHA256 {
			cost = defaultCostPBKDF2
		}
	}
	if hi == 0 {
		hi = defaultMaxSHA256
		if alg == AlgorithmPBKDF2SHA256 && !o.V1 {
			hi = defaultMaxPBKDF2
		}
	}
	if o.MinNumber > hi {
		return nil, fmt.Errorf("altcha: MinNumber %d above MaxNumber %d", o.MinNumber, hi)
	}
	r, err := rand.Int(rand.Reader, big.NewInt(int64(hi-o.MinNumber)+1))
	if err != nil {
		return nil, err
	}
	n := o.MinNumber + uint32(r.Uint64())
	if o.V1 {
		return json.Marshal(s.createV1(randomHex(12), o.Params, o.Expires.Unix(), uint64(n), uint64(hi)))
	}
	p := parameters{Algorithm: alg, Cost: cost, ExpiresAt: o.Expires.Unix(),
		KeyLength: keyLength, Nonce: randomHex(16), Salt: randomHex(16)}
	if len(o.Params) > 0 {
		p.Data = make(map[string]string, len(o.Params))
		for k, v := range o.Params {
			p.Data[k] = v
		}
	}
	c, err := s.createV2(p, n)
	if err != nil {
		return nil, err
	}
	return json.Marshal(c)
}

// createV1 is altcha-lib/v1's createChallenge with the given salt, number,
// params (in sorted key order) and expires.
func (s *Issuer) createV1(saltPrefix string, params map[string]string, expires int64, number, maxNumber uint64) challengeV1 {
	var b strings.Builder
	b.WriteString(saltPrefix)
	b.WriteByte('?')
	for _, k := range sortedKeys(params) {
		b.WriteString(formEncode(k) + "=" + formEncode(params[k]) + "&")
	}
	// The trailing '&' keeps salt+number from being re-split ("…=1&" + "23").
	fmt.Fprintf(&b, "expires=%d&", expires)
	salt := b.String()
	ch := hexSHA256(salt + strconv.FormatUint(number, 10))
	return challengeV1{Algorithm: AlgorithmSHA256, Challenge: ch, MaxNumber: maxNumber, Salt: salt, Signature: s.mac(ch)}
}

// createV2 is altcha-lib's createChallenge in deterministic mode (counter
// given, no key signature): keyPrefix is the first half of the key derived
// for counter, then the parameters are signed.
func (s *Issuer) createV2(p parameters, counter uint32) (challengeV2, error) {
	p.KeyPrefix = "00" // a placeholder that passes the checks
	if err := p.check(); err != nil {
		return challengeV2{}, err
	}
	key, err := p.deriveKey(counter)
	if err != nil {
		return challengeV2{}, err
	}
	p.KeyPrefix = hex.EncodeToString(key[:len(key)/2])
	return challengeV2{Parameters: p, Signature: s.mac(string(p.canonical()))}, nil
}

// Verify checks a payload the widget submitted (the value of its form field,
// "altcha" by default) at time now, and returns the parameters bound to the
// challenge. The checks run in order: decoding (ErrMalformed), signature
// (ErrBadSignature), then for V1 solution (ErrWrongSolution) and expiry
// (ErrExpired), for V2 expiry then solution (its parameters, the expiry
// and the cost of the derivation among them, are authenticated by the
// signature, so an expired V2 challenge costs no derivation). A payload
// that is not authentic never reports ErrExpired.
func (s *Issuer) Verify(payload string, now time.Time) (Result, error) {
	return s.VerifyFunc(payload, now, nil)
}

// VerifyFunc is Verify that calls claim, if not nil, once the payload is
// known to be authentic and unexpired but before its solution is checked:
// in V2 that check is a key derivation, the one costly step, so a caller
// that claims the challenge there (a replay set) pays at most one
// derivation per challenge it issued, however often a payload is sent.
// claim's error is returned as is. In V1 the parameters are authentic
// only through the solution's hash, so claim runs after the whole check.
func (s *Issuer) VerifyFunc(payload string, now time.Time, claim func(Result) error) (Result, error) {
	if len(payload) > maxPayload {
		return Result{}, fmt.Errorf("%w: %d bytes", ErrMalformed, len(payload))
	}
	raw, err := base64.StdEncoding.DecodeString(payload)
	if err != nil {
		return Result{}, fmt.Errorf("%w: base64: %v", ErrMalformed, err)
	}
	var probe struct {
		Challenge json.RawMessage `json:"challenge"`
	}
	if err := json.Unmarshal(raw, &probe); err != nil {
		return Result{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	switch c := bytes.TrimSpace(probe.Challenge); {
	case len(c) > 0 && c[0] == '"':
		r, err := s.verifyV1(raw, now)
		if err == nil && claim != nil {
			if err := claim(r); err != nil {
				return Result{}, err
			}
		}
		return r, err
	case len(c) > 0 && c[0] == '{':
		return s.verifyV2(raw, now, claim)
	}
	return Result{}, fmt.Errorf("%w: no challenge", ErrMalformed)
}

func (s *Issuer) verifyV1(raw []byte, now time.Time) (Result, error) {
	var p struct {
		Algorithm string          `json:"algorithm"`
		Challenge string          `json:"challenge"`
		Number    json.RawMessage `json:"number"`
		Salt      string          `json:"salt"`
		Signature string          `json:"signature"`
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return Result{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	// A JSON integer (not a string) that a JS number holds exactly.
	number, err := strconv.ParseUint(string(p.Number), 10, 53)
	if err != nil || p.Algorithm != AlgorithmSHA256 || p.Salt == "" {
		return Result{}, fmt.Errorf("%w: v1 algorithm %q, number %q, salt %q", ErrMalformed, p.Algorithm, p.Number, p.Salt)
	}
	if !hmac.Equal([]byte(s.mac(p.Challenge)), []byte(p.Signature)) {
		return Result{}, ErrBadSignature
	}
	salt := p.Salt
	if !strings.HasSuffix(salt, "&") { // as altcha-lib/v1 verifies
		salt += "&"
	}
	if !hmac.Equal([]byte(hexSHA256(salt+strconv.FormatUint(number, 10))), []byte(p.Challenge)) {
		return Result{}, ErrWrongSolution
	}
	// The query string is the part between the salt's first and second '?'.
	_, query, _ := strings.Cut(p.Salt, "?")
	query, _, _ = strings.Cut(query, "?")
	values, err := url.ParseQuery(query)
	if err != nil {
		return Result{}, fmt.Errorf("%w: salt parameters: %v", ErrMalformed, err)
	}
	params := make(map[string]string, len(values))
	for k, v := range values {
		if len(v) != 1 {
			return Result{}, fmt.Errorf("%w: salt parameter %q repeated", ErrMalformed, k)
		}
		params[k] = v[0]
	}
	exp, ok := params["expires"]
	if !ok {
		exp = params["expire"]
	}
	delete(params, "expires")
	delete(params, "expire")
	expires, err := strconv.ParseInt(exp, 10, 64)
	if err != nil {
		return Result{}, fmt.Errorf("%w: salt expiry %q", ErrMalformed, exp)
	}
	return result(params, expires, p.Signature, now)
}

func (s *Issuer) verifyV2(raw []byte, now time.Time, claim func(Result) error) (Result, error) {
	var p struct {
		Challenge struct {
			Parameters *parameters `json:"parameters"`
			Signature  string      `json:"signature"`
		} `json:"challenge"`
		Solution *struct {
			Counter    json.RawMessage `json:"counter"`
			DerivedKey string          `json:"derivedKey"`
		} `json:"solution"`
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return Result{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	params := p.Challenge.Parameters
	if params == nil || p.Solution == nil {
		return Result{}, fmt.Errorf("%w: no parameters or solution", ErrMalformed)
	}
	if err := params.check(); err != nil {
		return Result{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	counter, err := strconv.ParseUint(string(p.Solution.Counter), 10, 32) // a JSON integer
	if err != nil {
		return Result{}, fmt.Errorf("%w: counter %q", ErrMalformed, p.Solution.Counter)
	}
	if !hmac.Equal([]byte(s.mac(string(params.canonical()))), []byte(p.Challenge.Signature)) {
		return Result{}, ErrBadSignature
	}
	if params.ExpiresAt <= 0 { // never issued: Create requires an expiry
		return Result{}, fmt.Errorf("%w: no expiry", ErrMalformed)
	}
	r, err := result(params.Data, params.ExpiresAt, p.Challenge.Signature, now)
	if err != nil {
		return Result{}, err
	}
	if claim != nil {
		if err := claim(r); err != nil {
			return Result{}, err
		}
	}
	key, err := params.deriveKey(uint32(counter))
	if err != nil {
		return Result{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	keyHex := hex.EncodeToString(key)
	if !hmac.Equal([]byte(keyHex), []byte(p.Solution.DerivedKey)) ||
		!strings.HasPrefix(keyHex, strings.ToLower(params.KeyPrefix)) {
		return Result{}, ErrWrongSolution
	}
	return r, nil
}

func result(params map[string]string, expires int64, id string, now time.Time) (Result, error) {
	r := Result{Params: make(map[string]string, len(params)), Expires: time.Unix(expires, 0), ID: id}
	for k, v := range params {
		r.Params[k] = v
	}
	if now.After(r.Expires) {
		return Result{}, fmt.Errorf("%w at %s", ErrExpired, r.Expires.UTC().Format(time.RFC3339))
	}
	return r, nil
}

// check rejects what this package never issues, and so never signs.
func (p *parameters) check() error {
	switch {
	case p.Algorithm != AlgorithmPBKDF2SHA256 && p.Algorithm != AlgorithmSHA256:
		return fmt.Errorf("algorithm %q not supported", p.Algorithm)
	case p.Cost < 1 || p.Cost > maxCost:
		return fmt.Errorf("cost %d outside [1, %d]", p.Cost, maxCost)
	case p.KeyLength < 1 || p.KeyLength > maxKeyLength || (p.Algorithm == AlgorithmSHA256 && p.KeyLength > sha256.Size):
		return fmt.Errorf("keyLength %d not supported", p.KeyLength)
	case !isHex(p.Nonce, false) || !isHex(p.Salt, false) || !isHex(p.KeyPrefix, true) || int64(len(p.KeyPrefix)) > 2*p.KeyLength:
		return errors.New("nonce, salt or keyPrefix not hex")
	}
	return checkParams(p.Data)
}

// canonical is altcha-lib's canonicalJSON of the parameters: JSON.stringify
// with keys sorted, absent fields left out. checkParams keeps strings to
// printable ASCII, where JSON.stringify escapes only '"' and '\'.
func (p *parameters) canonical() []byte {
	var b bytes.Buffer
	b.WriteString(`{"algorithm":` + quote(p.Algorithm) + `,"cost":` + strconv.FormatInt(p.Cost, 10))
	if p.Data != nil {
		b.WriteString(`,"data":{`)
		for i, k := range sortedKeys(p.Data) {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(quote(k) + ":" + quote(p.Data[k]))
		}
		b.WriteByte('}')
	}
	if p.ExpiresAt != 0 {
		b.WriteString(`,"expiresAt":` + strconv.FormatInt(p.ExpiresAt, 10))
	}
	b.WriteString(`,"keyLength":` + strconv.FormatInt(p.KeyLength, 10) + `,"keyPrefix":` + quote(p.KeyPrefix) +
		`,"nonce":` + quote(p.Nonce) + `,"salt":` + quote(p.Salt) + "}")
	return b.Bytes()
}

// deriveKey is the key the client derives for counter: the password is the
// nonce's bytes then the counter as a big-endian uint32.
func (p *parameters) deriveKey(counter uint32) ([]byte, error) {
	nonce, _ := hex.DecodeString(p.Nonce)
	salt, _ := hex.DecodeString(p.Salt)
	password := binary.BigEndian.AppendUint32(nonce, counter)
	if p.Algorithm == AlgorithmPBKDF2SHA256 {
		return pbkdf2.Key(sha256.New, string(password), salt, int(p.Cost), int(p.KeyLength))
	}
	// SHA-256: hash salt‖password, then the digest, cost times in all. The
	// widget truncates each round to keyLength, altcha-lib only the last:
	// they agree only at keyLength 32, the length this package issues.
	sum := sha256.Sum256(append(salt, password...))
	for i := int64(1); i < p.Cost; i++ {
		sum = sha256.Sum256(sum[:])
	}
	return sum[:p.KeyLength], nil
}

func checkParams(params map[string]string) error {
	for k, v := range params {
		if len(k) > 64 || !isParamKey(k) || k == "expires" || k == "expire" {
			return fmt.Errorf("altcha: parameter name %q not allowed", k)
		}
		if len(v) > 256 || !isPrintableASCII(v) {
			return fmt.Errorf("altcha: parameter %q: value not printable ASCII of at most 256 bytes", k)
		}
	}
	return nil
}

// isParamKey: a letter, then letters, digits, '_', '-', '.'. A key that
// starts with a digit could be an array index, which JavaScript objects
// order before other keys, whatever the sort.
func isParamKey(k string) bool {
	for i := 0; i < len(k); i++ {
		c := k[i]
		letter := c|0x20 >= 'a' && c|0x20 <= 'z'
		if !letter && (i == 0 || !(c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.')) {
			return false
		}
	}
	return k != ""
}

func isPrintableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

func isHex(s string, nonEmpty bool) bool {
	_, err := hex.DecodeString(s)
	return err == nil && (s != "" || !nonEmpty)
}

// quote is JSON.stringify of a printable-ASCII string.
func quote(s string) string {
	b := make([]byte, 0, len(s)+2)
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		if s[i] == '"' || s[i] == '\\' {
			b = append(b, '\\')
		}
		b = append(b, s[i])
	}
	return string(append(b, '"'))
}

// formEncode is the application/x-www-form-urlencoded byte serializer of
// JavaScript's URLSearchParams, which altcha-lib/v1 puts in the salt: it
// keeps '*' and escapes '~', unlike url.QueryEscape.
func formEncode(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '*', c == '-', c == '.', c == '_':
			b.WriteByte(c)
		case c == ' ':
			b.WriteByte('+')
		default:
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func (s *Issuer) mac(msg string) string {
	h := hmac.New(sha256.New, s.key)
	h.Write([]byte(msg))
	return hex.EncodeToString(h.Sum(nil))
}

func hexSHA256(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b) // never fails since Go 1.24
	return hex.EncodeToString(b)
}

// Solve does what the widget does with a V2 challenge: it tries counters
// 0, 1, 2, ... up to limit and returns the payload to submit and the
// number of derivations it took. It is the client side, for tests and the
// load generator (bench -scenario opening), which solve proofs as people's
// browsers and bots would.
func Solve(challenge []byte, limit uint32) (payload string, tries uint32, err error) {
	var c challengeV2
	if err := json.Unmarshal(challenge, &c); err != nil {
		return "", 0, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if err := c.Parameters.check(); err != nil {
		return "", 0, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	for n := uint32(0); n <= limit; n++ {
		key, err := c.Parameters.deriveKey(n)
		if err != nil {
			return "", n, err
		}
		if k := hex.EncodeToString(key); strings.HasPrefix(k, strings.ToLower(c.Parameters.KeyPrefix)) {
			b, err := json.Marshal(map[string]any{"challenge": c, "solution": map[string]any{"counter": n, "derivedKey": k, "time": 0}})
			return base64.StdEncoding.EncodeToString(b), n + 1, err
		}
	}
	return "", limit + 1, fmt.Errorf("altcha: no counter up to %d solves the challenge", limit)
}
