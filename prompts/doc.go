// Package prompts owns chime's agent-facing text: the tool prompts that
// tell an agent how to call chime's subjects, and the framework messages
// chime delivers, as markdown embedded in the binary. Tests hold each tool
// prompt to the fields and values the code accepts, so they cannot drift.
package prompts
