package redisstore

import (
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
)

// parseDec answers exactly what strconv.ParseInt does, numbers and errors.
func TestParseDec(t *testing.T) {
	cases := []string{"", "-", "0", "-0", "7", "-7", "1700000000000", "4294967297", "123456789012345678",
		"-123456789012345678", "1234567890123456789", strconv.FormatInt(math.MaxInt64, 10), strconv.FormatInt(math.MinInt64, 10),
		"9223372036854775808", "12a", "a12", " 1", "1 ", "+1", "--1", "1.5", "1e3", "٣"}
	r := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		cases = append(cases, strconv.FormatInt(r.Int64()>>r.IntN(63), 10), strconv.FormatInt(-r.Int64()>>r.IntN(63), 10))
	}
	for _, s := range cases {
		got, gerr := parseDec(s)
		want, werr := strconv.ParseInt(s, 10, 64)
		if got != want || (gerr == nil) != (werr == nil) {
			t.Errorf("parseDec(%q) = %d, %v; strconv: %d, %v", s, got, gerr, want, werr)
		}
	}
}
