"""The web server around the Gradio app: serving a crowd, keeping the queue alive."""
