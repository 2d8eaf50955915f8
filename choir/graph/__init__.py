"""The orchestrator loop as a LangGraph application (imported only by ``choir run``)."""
