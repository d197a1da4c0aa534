from fracpilot_ingest.service import main

main()
