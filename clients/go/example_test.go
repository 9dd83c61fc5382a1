package kvindex_test

import (
	"context"
	"fmt"
	"log"

	kvindexv1 "github.com/kvindex/kvindex/api/proto/kvindex/v1"
	kvindex "github.com/kvindex/kvindex/clients/go"
)

// Score a text prompt: the indexer tokenizes it with the model's tokenizer and
// answers, per worker, how much of its prefix is cached.
func ExampleClient_ScoreText() {
	c, err := kvindex.New(kvindex.Options{Addrs: []string{exampleAddr}}) // e.g. "127.0.0.1:7070"
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	resp, err := c.ScoreText(context.Background(), "demo/model", "The quick brown fox jumps over the lazy dog")
	if err != nil {
		log.Fatal(err)
	}
	for _, s := range resp.Scores {
		fmt.Printf("%s: %d of %d blocks cached (hit rate %.2f)\n", s.Worker, s.MatchedBlocks, resp.TotalBlocks, s.HitRate)
	}
	// Output:
	// engine-0: 11 of 11 blocks cached (hit rate 1.00)
}

// Score token ids against some workers only; a worker the index does not know
// scores zero.
func ExampleClient_ScoreTokens() {
	c, err := kvindex.New(kvindex.Options{Addrs: []string{exampleAddr}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	resp, err := c.ScoreTokens(context.Background(), "demo/model", []uint32{256, 84, 104, 101, 32, 113, 117, 105}, "engine-0", "engine-9")
	if err != nil {
		log.Fatal(err)
	}
	for _, s := range resp.Scores {
		fmt.Printf("%s: %d tokens\n", s.Worker, s.MatchedTokens)
	}
	// Output:
	// engine-0: 8 tokens
	// engine-9: 0 tokens
}

// Register a worker through the leader, with the admin token; when the
// address given is a follower, the client follows it to the leader.
func ExampleClient_RegisterWorker() {
	c, err := kvindex.New(kvindex.Options{Addrs: []string{exampleAddr}, AdminToken: exampleToken})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	spec := &kvindexv1.WorkerSpec{Id: "engine-7", Model: "demo/model", BlockSize: 4, EventsEndpoint: "tcp://10.0.0.7:5557"}
	if _, err := c.RegisterWorker(ctx, spec); err != nil {
		log.Fatal(err)
	}
	workers, err := c.Workers(ctx, "demo/model")
	if err != nil {
		log.Fatal(err)
	}
	for _, w := range workers.Workers {
		fmt.Println(w.Spec.Id, w.Spec.BlockSize)
	}
	if _, err := c.UnregisterWorker(ctx, "engine-7"); err != nil {
		log.Fatal(err)
	}
	// Output:
	// engine-0 4
	// engine-7 4
}
