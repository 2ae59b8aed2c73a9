package benchfix

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

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
	calls, _, err := RedisCommands(ctx, c, "evalsha", "eval")
	return calls, err
}

// RedisCommands returns how many times the Redis server c talks to has
// run the named commands (lower case, as INFO commandstats names them;
// those a script ran included) and the microseconds they took, summed.
func RedisCommands(ctx context.Context, c rueidis.Client, names ...string) (calls, usec int64, err error) {
	info, err := c.Do(ctx, c.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(info, "\n") {
		name, fields, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "cmdstat_"), ":")
		if !ok || !slices.Contains(names, name) {
			continue
		}
		for _, f := range strings.Split(fields, ",") {
			k, v, _ := strings.Cut(f, "=")
			var n *int64
			switch k {
			case "calls":
				n = &calls
			case "usec":
				n = &usec
			default:
				continue
			}
			x, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return 0, 0, fmt.Errorf("INFO commandstats: %s: %w", line, err)
			}
			*n += x
		}
	}
	return calls, usec, nil
}

// SetexPipelined plays the naive design on the Redis c talks to — n
// beats, each a SET <key(i)> online EX 30, pipelined 100 at a time — and
// returns the Redis CPU seconds it took (RedisCPU).
func SetexPipelined(ctx context.Context, c rueidis.Client, n int, key func(i int) string) (float64, error) {
	cpu0, err := RedisCPU(ctx, c)
	if err != nil {
		return 0, err
	}
	cmds := make(rueidis.Commands, 0, 100)
	for i := 0; i < n; i += 100 {
		cmds = cmds[:0]
		for j := i; j < min(i+100, n); j++ {
			cmds = append(cmds, c.B().Set().Key(key(j)).Value("online").Ex(30*time.Second).Build())
		}
		for _, res := range c.DoMulti(ctx, cmds...) {
			if err := res.Error(); err != nil {
				return 0, err
			}
		}
	}
	cpu1, err := RedisCPU(ctx, c)
	return cpu1 - cpu0, err
}
