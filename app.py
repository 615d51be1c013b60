"""Launch the draftscope workbench: python app.py [--host 127.0.0.1] [--port 7860] [--db PATH] ..."""

from app.cli import main

if __name__ == "__main__":
    main()
