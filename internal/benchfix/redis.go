package benchfix

import (
	"context"
	"strconv"
	"strings"

	"github.com/redis/rueidis"
)

// RedisCPU returns the CPU seconds the Redis server c talks to has used
// (INFO cpu: user + system), to report Redis's cost per operation.
func RedisCPU(ctx context.Context, c rueidis.Client) (float64, error) {
	info, err := c.Do(ctx, c.B().Info().Section("cpu").Build()).ToString()
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, line := range strings.Split(info, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		if k == "used_cpu_user" || k == "used_cpu_sys" {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, err
			}
			sum += f
		}
	}
	return sum, nil
}

// RedisScripts returns how many scripts the Redis server c talks to has
// run (INFO commandstats: EVALSHA and EVAL calls).
func RedisScripts(ctx context.Context, c rueidis.Client) (int64, error) {
	info, err := c.Do(ctx, c.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		return 0, err
	}
	var n int64
	for _, line := range strings.Split(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:calls=")
		if !ok {
			rest, ok = strings.CutPrefix(strings.TrimSpace(line), "cmdstat_eval:calls=")
		}
		if ok {
			calls, _, _ := strings.Cut(rest, ",")
			v, err := strconv.ParseInt(calls, 10, 64)
			if err != nil {
				return 0, err
			}
			n += v
		}
	}
	return n, nil
}
