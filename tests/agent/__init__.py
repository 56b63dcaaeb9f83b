"""Tests of the agent loop: steps, tools, approvals, delivery modes."""
