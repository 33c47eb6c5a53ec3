// Go Kafka clients against an icelog broker: franz-go (github.com/twmb/franz-go) and IBM/sarama. Usage:
//   goclients franz|franz848|sarama <bootstrap> <topic prefix>
// Each prints one JSON object with what the client saw; tests/go/test_go_clients.py judges it. The topics are
// created by the test beforehand (3 partitions each, 4 for franz848's KIP-848 group).
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"
)

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: goclients franz|franz848|sarama <bootstrap> <topic prefix>")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	out := map[string]any{}
	var err error
	switch os.Args[1] {
	case "franz":
		err = franzChecks(ctx, os.Args[2], os.Args[3], out)
	case "franz848":
		err = franz848Checks(ctx, os.Args[2], os.Args[3], out)
	case "sarama":
		err = saramaChecks(ctx, os.Args[2], os.Args[3], out)
	default:
		err = fmt.Errorf("no client %q", os.Args[1])
	}
	if err != nil {
		out["error"] = err.Error()
	}
	line, _ := json.Marshal(out)
	fmt.Println(string(line))
}
