"""Shared Kubernetes adapters: the client factory and the async informer layer."""
