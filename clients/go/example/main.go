// Command example drives muster from Go with the client generated from
// proto/: it serves one agent as a worker (ConnectWorker), publishes a
// process, starts it, watches its events until it finishes, and exits 0 if
// it completed.
//
// Settings, from the environment:
//
//	MUSTER_EXECUTION_ADDR  the execution service, host:port (plaintext)
//	MUSTER_TOKEN           an operator's token, for publishing and starting
//	MUSTER_AGENT_ID        the agent the worker serves
//	MUSTER_AGENT_TOKEN     its roster token
//	MUSTER_PROCESS_FILE    the process to publish and run
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	commonv1 "example.com/muster/gen/go/muster/common/v1"
	executionv1 "example.com/muster/gen/go/muster/execution/v1"
)

func setting(name string) string {
	value := os.Getenv(name)
	if value == "" {
		fmt.Fprintf(os.Stderr, "example: set %s\n", name)
		os.Exit(2)
	}
	return value
}

// as returns a context whose calls carry token as their bearer credential.
func as(ctx context.Context, token string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

// serve answers each assignment of the agent with a short output until ctx ends.
func serve(ctx context.Context, client executionv1.ExecutionServiceClient, agentID, token string, ready chan<- error) {
	stream, err := client.ConnectWorker(as(ctx, token))
	if err != nil {
		ready <- err
		return
	}
	send := make(chan *executionv1.ConnectWorkerRequest, 16)
	go func() {
		for request := range send {
			if err := stream.Send(request); err != nil {
				return
			}
		}
	}()
	send <- &executionv1.ConnectWorkerRequest{Message: &executionv1.ConnectWorkerRequest_Hello{Hello: &executionv1.WorkerHello{
		WorkerName: "go-example",
		Agents:     []*executionv1.ServedAgent{{AgentId: agentID, Token: token}},
	}}}
	for {
		response, err := stream.Recv()
		if err != nil {
			if ctx.Err() == nil && err != io.EOF {
				ready <- err
			}
			return
		}
		switch message := response.Message.(type) {
		case *executionv1.ConnectWorkerResponse_Welcome:
			lease := message.Welcome.GetLease().AsDuration()
			go func() {
				ticker := time.NewTicker(lease / 3)
				defer ticker.Stop()
				for {
					select {
					case <-ctx.Done():
						return
					case <-ticker.C:
						send <- &executionv1.ConnectWorkerRequest{Message: &executionv1.ConnectWorkerRequest_Heartbeat{Heartbeat: &executionv1.WorkerHeartbeat{}}}
					}
				}
			}()
			fmt.Printf("worker welcomed as %s\n", message.Welcome.GetWorkerId())
			ready <- nil
		case *executionv1.ConnectWorkerResponse_Assignment:
			assignment := message.Assignment
			output := structpb.NewStringValue(fmt.Sprintf("%s, from Go", assignment.GetMessage()))
			fmt.Printf("assignment %s: step %s\n", assignment.GetAssignmentId(), assignment.GetStepId())
			send <- &executionv1.ConnectWorkerRequest{Message: &executionv1.ConnectWorkerRequest_Result{Result: &executionv1.StepResult{
				AssignmentId: assignment.GetAssignmentId(),
				Output:       output,
			}}}
		}
	}
}

func main() {
	conn, err := grpc.Dial(setting("MUSTER_EXECUTION_ADDR"), grpc.WithInsecure())
	if err != nil {
		fmt.Fprintf(os.Stderr, "example: %v\n", err)
		os.Exit(1)
	}
	defer conn.Close()
	client := executionv1.NewExecutionServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	ready := make(chan error, 2)
	go serve(ctx, client, setting("MUSTER_AGENT_ID"), setting("MUSTER_AGENT_TOKEN"), ready)
	if err := <-ready; err != nil {
		fmt.Fprintf(os.Stderr, "example: the worker was refused: %v\n", err)
		os.Exit(1)
	}

	operator := as(ctx, setting("MUSTER_TOKEN"))
	source, err := os.ReadFile(setting("MUSTER_PROCESS_FILE"))
	if err != nil {
		fmt.Fprintf(os.Stderr, "example: %v\n", err)
		os.Exit(2)
	}
	published, err := client.PublishProcess(operator, &executionv1.PublishProcessRequest{Source: string(source)})
	if err != nil {
		fmt.Fprintf(os.Stderr, "example: publish: %v\n", err)
		os.Exit(1)
	}
	name := published.GetProcess().GetName()
	fmt.Printf("published %s version %d\n", name, published.GetProcess().GetVersion())
	started, err := client.StartExecution(operator, &executionv1.StartExecutionRequest{ProcessName: name})
	if err != nil {
		fmt.Fprintf(os.Stderr, "example: start: %v\n", err)
		os.Exit(1)
	}
	id := started.GetExecution().GetId()
	fmt.Printf("started %s\n", id)

	events, err := client.WatchExecution(operator, &executionv1.WatchExecutionRequest{ExecutionId: id})
	if err != nil {
		fmt.Fprintf(os.Stderr, "example: watch: %v\n", err)
		os.Exit(1)
	}
	for {
		response, err := events.Recv()
		if err != nil {
			fmt.Fprintf(os.Stderr, "example: watch: %v\n", err)
			os.Exit(1)
		}
		event := response.GetEvent()
		fmt.Printf("event %s %s\n", strings.TrimPrefix(event.GetEventType().String(), "EVENT_TYPE_"), event.GetStepId())
		if event.GetEventType() == commonv1.EventType_EVENT_TYPE_EXECUTION_FINISHED {
			break
		}
	}
	finished, err := client.GetExecution(operator, &executionv1.GetExecutionRequest{Id: id})
	if err != nil {
		fmt.Fprintf(os.Stderr, "example: get: %v\n", err)
		os.Exit(1)
	}
	status := finished.GetExecution().GetStatus()
	fmt.Printf("finished: %s\n", strings.TrimPrefix(status.String(), "EXECUTION_STATUS_"))
	for _, step := range finished.GetExecution().GetSteps() {
		fmt.Printf("step %s: %s\n", step.GetStepId(), step.GetOutput().GetStringValue())
	}
	if status != commonv1.ExecutionStatus_EXECUTION_STATUS_COMPLETED {
		os.Exit(1)
	}
}
